/**
 * The drive plugin: the Sandbox drive (sessions as folders, their workspaces inside) in the
 * contents manager, and a file browser of its own in the left sidebar.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin,
  JupyterLab
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { IDefaultFileBrowser, IFileBrowserFactory } from '@jupyterlab/filebrowser';
import { IStateDB } from '@jupyterlab/statedb';
import { ITranslator } from '@jupyterlab/translation';

import { addDriveCommands } from '../commands';
import { SandboxDrive } from '../drive';
import { DRIVE_BROWSER_ID, createDriveBrowser } from '../drivebrowser';
import { trackOnFirstUse } from '../tracking';
import { ISandboxSessions } from '../tokens';

export const drivePlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-tai-sandbox:drive',
  description: 'The Sandbox drive: each session a folder, in a file browser of its own.',
  autoStart: true,
  requires: [ISandboxSessions],
  optional: [
    ICommandPalette,
    ILayoutRestorer,
    IFileBrowserFactory,
    IDefaultFileBrowser,
    IDocumentManager,
    ITranslator,
    IStateDB,
    JupyterLab.IInfo
  ],
  activate: (
    app: JupyterFrontEnd,
    sessions: ISandboxSessions,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    browserFactory: IFileBrowserFactory | null,
    defaultBrowser: IDefaultFileBrowser | null,
    manager: IDocumentManager | null,
    translator: ITranslator | null,
    state: IStateDB | null,
    info: JupyterLab.IInfo | null
  ) => {
    const { shell } = app;
    const drive = new SandboxDrive(sessions.client);
    app.serviceManager.contents.addDrive(drive);
    if (!browserFactory || !manager) {
      addDriveCommands(app.commands, null, palette);
      return;
    }
    const browser = createDriveBrowser({
      driveName: drive.name,
      manager,
      translator: translator ?? undefined,
      state: state ?? undefined,
      info: info ?? undefined,
      notifyError: message => sessions.notifyError(message)
    });
    if (defaultBrowser) {
      trackOnFirstUse(browserFactory.tracker, browser);
    } else {
      void browserFactory.tracker.add(browser);
    }
    shell.add(browser, 'left', { rank: 251 });
    restorer?.add(browser, DRIVE_BROWSER_ID);

    addDriveCommands(
      app.commands,
      async sessionId => {
        shell.activateById(browser.id);
        await browser.model.cd(`/${sessionId}`);
      },
      palette
    );
  }
};
