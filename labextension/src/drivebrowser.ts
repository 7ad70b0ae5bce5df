/**
 * The Sandbox drive's file browser (a sidebar of its own), and how it joins the file browsers'
 * tracker without taking "current" from the default browser.
 */
import { JupyterLab } from '@jupyterlab/application';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { FileBrowser, FilterFileBrowserModel, Uploader } from '@jupyterlab/filebrowser';
import { IStateDB } from '@jupyterlab/statedb';
import { ITranslator } from '@jupyterlab/translation';
import { ToolbarButton, newFolderIcon, refreshIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { DRIVE_NAME } from './drive';
import { sandboxDriveIcon } from './icon';

export const DRIVE_BROWSER_ID = 'tai-sandbox-filebrowser';

export namespace DriveBrowser {
  export interface IOptions {
    driveName: string;
    manager: IDocumentManager;
    translator?: ITranslator;
    state?: IStateDB;
    info?: JupyterLab.IInfo;
    /** Show a refusal (a new folder at the drive's top level). */
    notifyError(message: string): void;
  }
}

/**
 * The drive's browser, built as IFileBrowserFactory.createFileBrowser builds one (same model
 * options, restored path, refresh standby) but not added to the factory's tracker: the
 * drive plugin adds it on first use (trackOnFirstUse in tracking.ts).
 */
export function createDriveBrowser(options: DriveBrowser.IOptions): FileBrowser {
  const { info, state, translator } = options;
  const model = new FilterFileBrowserModel({
    translator,
    auto: true,
    manager: options.manager,
    driveName: options.driveName,
    refreshInterval: 5000,
    refreshStandby: () => (info && !info.isConnected) || 'when-hidden',
    state,
    allowFileUploads: true
  });
  const browser = new FileBrowser({ id: DRIVE_BROWSER_ID, model, translator, state });
  browser.addClass('jp-TaiSandbox-drive');
  const heading = new Widget({ node: document.createElement('h2') });
  heading.node.textContent = 'Sandbox files';
  heading.addClass('jp-TaiSandbox-title');
  browser.header.addWidget(heading);
  browser.title.icon = sandboxDriveIcon;
  browser.title.caption = 'Sandbox files: each session is a folder';
  browser.toolbar.addItem(
    'new-folder',
    new ToolbarButton({
      icon: newFolderIcon,
      tooltip: 'New folder',
      className: 'jp-TaiSandbox-driveNewFolder',
      onClick: () => {
        if (!browser.model.path.slice(DRIVE_NAME.length + 1)) {
          options.notifyError('Open a session folder first: new folders go inside a session.');
          return;
        }
        void browser.createNewDirectory();
      }
    })
  );
  browser.toolbar.addItem('upload', new Uploader({ model: browser.model }));
  browser.toolbar.addItem(
    'refresh',
    new ToolbarButton({
      icon: refreshIcon,
      tooltip: 'Refresh (shows what commands changed in the session)',
      className: 'jp-TaiSandbox-driveRefresh',
      onClick: () => void browser.model.refresh()
    })
  );
  return browser;
}
