/**
 * jupyter-tai-sandbox: the JupyterLab panel of the sandbox server extension.
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin,
  LayoutRestorer
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  Notification,
  WidgetTracker,
  showDialog
} from '@jupyterlab/apputils';
import {
  FileBrowser,
  IDefaultFileBrowser,
  IFileBrowserFactory,
  Uploader
} from '@jupyterlab/filebrowser';
import { IRunningSessionManagers } from '@jupyterlab/running';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { Widget } from '@lumino/widgets';
import { ToolbarButton, newFolderIcon, refreshIcon } from '@jupyterlab/ui-components';

import { ISessionInfo, Network, SandboxClient } from './api';
import { NewSessionBody } from './dialogs';
import { DRIVE_NAME, SandboxDrive } from './drive';
import { SandboxFiles } from './files';
import { sandboxDriveIcon, sandboxIcon } from './icon';
import { EXTEND_SECONDS, extendedTtl } from './kernels';
import { SessionsModel, describeError, secondsLeft } from './model';
import { SandboxPanel } from './panel';
import { SandboxSessionsRunning, SandboxTerminalsRunning } from './running';
import { ISessionForm, ISpecDefaults, SpecFormError, buildSpec, defaultForm } from './spec';
import { SandboxTerminal } from './terminal';
import { SandboxAPIError } from './request';

const PLUGIN_ID = 'jupyter-tai-sandbox:plugin';
/** Seconds between two measures of the sessions' resource use while the panel shows. */
const USAGE_SECONDS = 15;

export namespace CommandIDs {
  export const newSession = 'tai-sandbox:new-session';
  export const openTerminal = 'tai-sandbox:open-terminal';
  export const restoreTerminal = 'tai-sandbox:restore-terminal';
  export const browseDrive = 'tai-sandbox:browse-drive';
  export const openFiles = 'tai-sandbox:open-files';
  export const destroy = 'tai-sandbox:destroy';
  export const extendTtl = 'tai-sandbox:extend-ttl';
  export const showPanel = 'tai-sandbox:show-panel';
}

/** The user's settings (schema/plugin.json). */
interface ISettings extends ISpecDefaults {
  terminalCommand: string[];
  pollIntervalSeconds: number;
}

const DEFAULTS: ISettings = {
  image: '',
  ttlSeconds: 3600,
  network: 'egress',
  terminalCommand: ['sh', '-i'],
  pollIntervalSeconds: 3
};

function readSettings(settings: ISettingRegistry.ISettings): ISettings {
  const get = <T>(key: string, fallback: T): T => {
    const value = settings.get(key).composite as T | undefined;
    return value === undefined || value === null ? fallback : value;
  };
  const command = get<string[]>('terminalCommand', DEFAULTS.terminalCommand);
  return {
    image: get('defaultImage', DEFAULTS.image),
    ttlSeconds: get('defaultTtlSeconds', DEFAULTS.ttlSeconds),
    network: get<Network>('defaultNetwork', DEFAULTS.network),
    terminalCommand: command.length ? command : DEFAULTS.terminalCommand,
    pollIntervalSeconds: get('pollIntervalSeconds', DEFAULTS.pollIntervalSeconds)
  };
}

function notifyError(message: string): void {
  Notification.error(message, { autoClose: 10000 });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Sandbox sessions: a sidebar panel, a terminal into a session and its files.',
  autoStart: true,
  optional: [
    ICommandPalette,
    ILayoutRestorer,
    ISettingRegistry,
    IFileBrowserFactory,
    IDefaultFileBrowser,
    IRunningSessionManagers
  ],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    browserFactory: IFileBrowserFactory | null,
    defaultBrowser: IDefaultFileBrowser | null,
    runningManagers: IRunningSessionManagers | null
  ) => {
    const { commands, shell } = app;
    const client = new SandboxClient(app.serviceManager.serverSettings);
    let settings: ISettings = { ...DEFAULTS };
    let panel: SandboxPanel | null = null;
    const model = new SessionsModel({
      client,
      interval: settings.pollIntervalSeconds,
      // the sessions show in the panel and in JupyterLab's Running sidebar
      standby: () => !(panel?.isVisible || runningSidebarVisible()),
      usageInterval: USAGE_SECONDS
    });
    /** JupyterLab's Running sidebar (id jp-running-sessions) is open. */
    function runningSidebarVisible(): boolean {
      if (!runningManagers) {
        return false;
      }
      for (const widget of shell.widgets('left')) {
        if (widget.id === 'jp-running-sessions' && widget.isVisible) {
          return true;
        }
      }
      for (const widget of shell.widgets('right')) {
        if (widget.id === 'jp-running-sessions' && widget.isVisible) {
          return true;
        }
      }
      return false;
    }
    const files = new Map<string, SandboxFiles>();
    // terminal tabs, restored after a page reload by their session and exec id
    const terminals = new WidgetTracker<SandboxTerminal>({ namespace: 'tai-sandbox-terminal' });
    if (restorer) {
      void restorer.restore(terminals, {
        command: CommandIDs.restoreTerminal,
        args: widget => ({ sessionId: widget.sessionId, execId: widget.execId }),
        name: widget => widget.execId ?? widget.id
      });
    }

    /** Show an error whole in the panel, and briefly as a notification. */
    function reportError(title: string, message: string): void {
      panel?.showError(title, message);
      Notification.error(`${title} ${message}`, {
        autoClose: 10000,
        actions: [
          {
            label: 'Show',
            caption: 'Show the whole message in the Sandbox panel',
            callback: () => shell.activateById(panel!.id)
          }
        ]
      });
    }

    model.notice.connect((_, notice) => {
      const options = {
        autoClose: notice.level === 'error' ? 10000 : 5000,
        actions: notice.showPanel
          ? [{ label: 'Show', callback: () => shell.activateById(panel!.id) }]
          : undefined
      };
      if (notice.level === 'error') {
        Notification.error(notice.message, options);
      } else if (notice.level === 'success') {
        Notification.success(notice.message, options);
      } else {
        Notification.info(notice.message, options);
      }
    });

    /** The session to act on: the id given, or one the user picks. */
    async function pickSession(args: any, verb: string): Promise<string | null> {
      if (typeof args?.id === 'string' && args.id) {
        return args.id;
      }
      const state = await model.refresh();
      if (state.connection !== 'ok') {
        reportError(`Cannot ${verb}:`, state.problem ?? state.status?.message ?? 'the sandbox is off.');
        return null;
      }
      if (!state.sessions.length) {
        Notification.info('There is no sandbox session yet: create one first.', { autoClose: 5000 });
        return null;
      }
      const labels = state.sessions.map(s => `${s.id} (${s.consumer}, ${s.image ?? 'default image'})`);
      const result = await InputDialog.getItem({
        title: `Session to ${verb}`,
        items: labels,
        current: 0
      });
      if (!result.button.accept || result.value === null) {
        return null;
      }
      return state.sessions[labels.indexOf(result.value)]?.id ?? null;
    }

    /** The session, fresh from the server; null (and a notification) when it is gone. */
    async function fetchSession(id: string, verb: string): Promise<ISessionInfo | null> {
      try {
        return await client.getSession(id);
      } catch (error) {
        if (error instanceof SandboxAPIError && error.status === 404) {
          notifyError(`Cannot ${verb}: session ${id} is gone (destroyed or reaped).`);
          model.removeLocally(id);
        } else {
          notifyError(`Cannot ${verb}: ${describeError(error)}`);
        }
        return null;
      }
    }

    async function newSession(initial?: ISessionForm): Promise<ISessionInfo | null> {
      const state = model.state.connection === 'ok' ? model.state : await model.refresh();
      if (state.connection !== 'ok') {
        reportError(
          'Cannot create a session:',
          state.problem ?? state.status?.message ?? 'the sandbox is off.'
        );
        return null;
      }
      const body = new NewSessionBody(initial ?? defaultForm(settings), state.status);
      const result = await showDialog({
        title: 'New sandbox session',
        body,
        buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Create' })],
        focusNodeSelector: 'input'
      });
      if (!result.button.accept || !result.value) {
        return null;
      }
      let spec;
      try {
        spec = buildSpec(result.value);
      } catch (error) {
        if (error instanceof SpecFormError) {
          notifyError(error.message);
          return newSession(result.value);
        }
        throw error;
      }
      try {
        const info = await client.createSession(spec);
        panel?.clearError();
        model.addLocally(info);
        Notification.success(`Sandbox session ${info.id} created.`, { autoClose: 3000 });
        void model.refreshSoon();
        return info;
      } catch (error) {
        reportError('Could not create the session:', describeError(error));
        return null;
      }
    }

    async function openTerminal(id: string): Promise<SandboxTerminal | null> {
      const info = await fetchSession(id, 'open a terminal');
      if (!info) {
        return null;
      }
      const terminal = new SandboxTerminal({
        client,
        sessionId: id,
        argv: settings.terminalCommand,
        // the command may live as long as its session
        timeoutSeconds: Math.max(60, Math.ceil(secondsLeft(info, Date.now(), Date.now())))
      });
      track(terminal);
      shell.add(terminal, 'main');
      shell.activateById(terminal.id);
      return terminal;
    }

    /** Tracked (so the layout restorer brings it back) once its command has an exec id. */
    function track(terminal: SandboxTerminal, restoring = false): void {
      terminal.title.icon = sandboxIcon;
      const save = () => {
        if (!terminal.execId || terminal.isDisposed) {
          return;
        }
        if (terminals.has(terminal)) {
          void terminals.save(terminal);
        } else {
          // a restored tab is in the layout being restored already
          void terminals.add(terminal).then(restoring ? undefined : saveLayout);
        }
      };
      terminal.execChanged.connect(save);
      save();
    }

    /**
     * Save the shell's layout now: a tab becomes restorable once tracked (when
     * its exec id is known), after the shell saved the layout that opened it.
     */
    function saveLayout(): void {
      const labShell = shell as ILabShell;
      if (restorer instanceof LayoutRestorer && typeof labShell.saveLayout === 'function') {
        restorer.save(labShell.saveLayout()).catch(() => {
          // restoration still under way: the shell saves again on its next change
        });
      }
    }

    /** A terminal tab brought back by the layout restorer: attach to its command again. */
    function restoreTerminal(args: any): SandboxTerminal | null {
      const sessionId = typeof args?.sessionId === 'string' ? args.sessionId : '';
      const execId = typeof args?.execId === 'string' ? args.execId : '';
      if (!sessionId || !execId) {
        return null;
      }
      const terminal = new SandboxTerminal({
        client,
        sessionId,
        execId,
        argv: settings.terminalCommand,
        timeoutSeconds: 3600
      });
      track(terminal, true);
      shell.add(terminal, 'main', { activate: false });
      return terminal;
    }

    async function openFiles(id: string): Promise<SandboxFiles | null> {
      const existing = files.get(id);
      if (existing && !existing.isDisposed) {
        shell.activateById(existing.id);
        void existing.refresh();
        return existing;
      }
      const info = await fetchSession(id, 'browse the files');
      if (!info) {
        return null;
      }
      const widget = new SandboxFiles({ client, sessionId: id });
      widget.title.icon = sandboxIcon;
      files.set(id, widget);
      widget.disposed.connect(() => files.delete(id));
      shell.add(widget, 'main');
      shell.activateById(widget.id);
      return widget;
    }

    async function destroy(id: string): Promise<boolean> {
      const info = model.find(id);
      const persistent = info?.durability === 'persistent';
      const result = await showDialog({
        title: 'Destroy sandbox session?',
        body:
          `Session ${id} will be destroyed and its running commands stopped.` +
          (persistent
            ? ` Its persistent workspace "${info?.workspace_key}" is kept unless you tick the box.`
            : ' Its workspace is deleted.'),
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Destroy' })],
        checkbox: persistent ? { label: 'Also delete the persistent workspace', checked: false } : null
      });
      if (!result.button.accept) {
        return false;
      }
      try {
        await client.destroySession(id, persistent && !!result.isChecked);
      } catch (error) {
        if (error instanceof SandboxAPIError && error.status === 404) {
          Notification.info(`Session ${id} was already gone.`, { autoClose: 5000 });
          model.removeLocally(id);
          return true;
        }
        notifyError(`Could not destroy session ${id}: ${describeError(error)}`);
        return false;
      }
      model.removeLocally(id);
      files.get(id)?.dispose();
      Notification.success(`Sandbox session ${id} destroyed.`, { autoClose: 3000 });
      void model.refreshSoon();
      return true;
    }

    /** "+30 min": PATCH the TTL to the current one plus 30 minutes; a refusal is shown whole. */
    async function extendTtl(id: string): Promise<boolean> {
      const info = await fetchSession(id, 'extend the session');
      if (!info) {
        return false;
      }
      const ttl = extendedTtl(info, EXTEND_SECONDS);
      try {
        const updated = await client.setTtl(id, ttl);
        panel?.clearError();
        model.updateLocally(updated);
        Notification.success(
          `Sandbox session ${id} now ends ${Math.round(EXTEND_SECONDS / 60)} minutes later.`,
          { autoClose: 3000 }
        );
        return true;
      } catch (error) {
        reportError(`Could not extend session ${id}:`, describeError(error));
        return false;
      } finally {
        void model.refreshSoon();
      }
    }

    panel = new SandboxPanel({
      model,
      actions: {
        newSession: () => void commands.execute(CommandIDs.newSession),
        openTerminal: id => void commands.execute(CommandIDs.openTerminal, { id }),
        openFiles: id => void commands.execute(CommandIDs.openFiles, { id }),
        destroy: id => void commands.execute(CommandIDs.destroy, { id }),
        extendTtl: async id => {
          await commands.execute(CommandIDs.extendTtl, { id });
        },
        openDocument: path => void commands.execute('docmanager:open', { path })
      }
    });
    panel.title.icon = sandboxIcon;
    shell.add(panel, 'left', { rank: 250 });
    restorer?.add(panel, 'tai-sandbox-panel');

    if (runningManagers) {
      runningManagers.add(
        new SandboxTerminalsRunning({
          forEach: fn => terminals.forEach(fn),
          widgetAdded: terminals.widgetAdded,
          activate: terminal => shell.activateById(terminal.id),
          icon: sandboxIcon
        })
      );
      runningManagers.add(
        new SandboxSessionsRunning({
          model,
          icon: sandboxIcon,
          reveal: id => {
            shell.activateById(panel!.id);
            panel!.revealSession(id);
          },
          destroy: async id => {
            try {
              await client.destroySession(id);
            } catch (error) {
              if (!(error instanceof SandboxAPIError && error.status === 404)) {
                notifyError(`Could not destroy session ${id}: ${describeError(error)}`);
                throw error;
              }
            }
            files.get(id)?.dispose();
          },
          shutdownKernel: async kernelId => {
            try {
              await app.serviceManager.kernels.shutdown(kernelId);
            } catch (error) {
              notifyError(`Could not shut down kernel ${kernelId}: ${describeError(error)}`);
              throw error;
            }
          }
        })
      );
    }

    // the Sandbox drive: sessions as folders, their workspaces inside, in a file browser of its own
    const drive = new SandboxDrive(client);
    app.serviceManager.contents.addDrive(drive);
    let driveBrowser: FileBrowser | null = null;
    if (browserFactory) {
      driveBrowser = browserFactory.createFileBrowser('tai-sandbox-filebrowser', {
        driveName: drive.name,
        refreshInterval: 5000
      });
      const browser = driveBrowser;
      keepDefaultBrowserCurrent(browserFactory, browser, defaultBrowser);
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
              notifyError('Open a session folder first: new folders go inside a session.');
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
      shell.add(browser, 'left', { rank: 251 });
      restorer?.add(browser, 'tai-sandbox-filebrowser');
    }

    commands.addCommand(CommandIDs.newSession, {
      label: 'New Sandbox Session…',
      caption: 'Create a sandbox session',
      icon: sandboxIcon,
      execute: () => newSession()
    });
    commands.addCommand(CommandIDs.openTerminal, {
      label: 'Open Sandbox Terminal',
      caption: 'Open a terminal in a sandbox session',
      execute: async args => {
        const id = await pickSession(args, 'open a terminal in');
        return id ? openTerminal(id) : null;
      }
    });
    commands.addCommand(CommandIDs.restoreTerminal, {
      label: 'Reattach a Sandbox Terminal',
      execute: args => restoreTerminal(args)
    });
    commands.addCommand(CommandIDs.browseDrive, {
      label: 'Show Sandbox Files',
      caption: "Show the Sandbox drive (a session's workspace) in the file browser",
      isEnabled: () => !!driveBrowser,
      execute: async args => {
        if (!driveBrowser) {
          return;
        }
        const id = typeof args?.id === 'string' ? args.id : '';
        shell.activateById(driveBrowser.id);
        await driveBrowser.model.cd(`/${id}`);
      }
    });
    commands.addCommand(CommandIDs.openFiles, {
      label: 'Browse Sandbox Files',
      caption: "Browse a sandbox session's workspace",
      execute: async args => {
        const id = await pickSession(args, 'browse');
        return id ? openFiles(id) : null;
      }
    });
    commands.addCommand(CommandIDs.destroy, {
      label: 'Destroy Sandbox Session…',
      caption: 'Destroy a sandbox session',
      execute: async args => {
        const id = await pickSession(args, 'destroy');
        return id ? destroy(id) : false;
      }
    });
    commands.addCommand(CommandIDs.extendTtl, {
      label: 'Extend Sandbox Session by 30 Minutes',
      caption: 'Reap a sandbox session 30 minutes later (within the operator\'s maximum)',
      execute: async args => {
        const id = await pickSession(args, 'extend');
        return id ? extendTtl(id) : false;
      }
    });
    commands.addCommand(CommandIDs.showPanel, {
      label: 'Show Sandbox Sessions',
      execute: () => shell.activateById(panel!.id)
    });

    if (palette) {
      const category = 'Sandbox';
      for (const command of [
        CommandIDs.newSession,
        CommandIDs.openTerminal,
        CommandIDs.openFiles,
        CommandIDs.destroy,
        CommandIDs.extendTtl,
        CommandIDs.showPanel,
        CommandIDs.browseDrive
      ]) {
        palette.addItem({ command, category });
      }
    }

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(loaded => {
          const apply = () => {
            settings = readSettings(loaded);
            model.setInterval(settings.pollIntervalSeconds);
          };
          apply();
          loaded.changed.connect(apply);
        })
        .catch(reason => {
          console.warn('jupyter-tai-sandbox: cannot load settings, using defaults', reason);
        });
    }

    model.start();
  }
};

/**
 * JupyterLab's launcher creates a notebook in `cwd || tracker.currentWidget.model.path`:
 * at the server's root (cwd '') it falls back to the file browsers' tracker, whose
 * current widget is the last browser added while nothing had focus. That would be
 * the Sandbox drive's browser, so "Notebook" in the launcher would try to create the
 * file in the Sandbox drive. Until the user focuses the drive's browser, give
 * "current" back to the default file browser.
 */
function keepDefaultBrowserCurrent(
  factory: IFileBrowserFactory,
  browser: FileBrowser,
  defaultBrowser: FileBrowser | null
): void {
  if (!defaultBrowser) {
    return;
  }
  const tracker = factory.tracker;
  // WidgetTracker has no public setter for its current widget: its pool's `current` is it
  const pool = (tracker as any)._pool as { current: FileBrowser | null } | undefined;
  const fix = () => {
    const focused = browser.node.contains(document.activeElement);
    if (
      tracker.currentWidget === browser &&
      !focused &&
      !defaultBrowser.isDisposed &&
      tracker.has(defaultBrowser) &&
      pool &&
      'current' in pool
    ) {
      pool.current = defaultBrowser;
    }
  };
  tracker.currentChanged.connect(fix);
  fix();
}

export default plugin;
