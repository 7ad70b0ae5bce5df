/**
 * jupyter-tai-sandbox: the JupyterLab panel of the sandbox server extension.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { ISessionInfo, Network, SandboxClient } from './api';
import { NewSessionBody } from './dialogs';
import { SandboxFiles } from './files';
import { sandboxIcon } from './icon';
import { SessionsModel, describeError, secondsLeft } from './model';
import { SandboxPanel } from './panel';
import { ISessionForm, ISpecDefaults, SpecFormError, buildSpec, defaultForm } from './spec';
import { SandboxTerminal } from './terminal';
import { SandboxAPIError } from './request';

const PLUGIN_ID = 'jupyter-tai-sandbox:plugin';

export namespace CommandIDs {
  export const newSession = 'tai-sandbox:new-session';
  export const openTerminal = 'tai-sandbox:open-terminal';
  export const openFiles = 'tai-sandbox:open-files';
  export const destroy = 'tai-sandbox:destroy';
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
  optional: [ICommandPalette, ILayoutRestorer, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const { commands, shell } = app;
    const client = new SandboxClient(app.serviceManager.serverSettings);
    let settings: ISettings = { ...DEFAULTS };
    let panel: SandboxPanel | null = null;
    const model = new SessionsModel({
      client,
      interval: settings.pollIntervalSeconds,
      standby: () => !panel || !panel.isVisible
    });
    const files = new Map<string, SandboxFiles>();

    model.notice.connect((_, notice) => {
      const options = { autoClose: notice.level === 'error' ? 10000 : 5000 };
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
        notifyError(`Cannot ${verb}: ${state.problem ?? state.status?.message ?? 'the sandbox is off.'}`);
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
        notifyError(
          `Cannot create a session: ${state.problem ?? state.status?.message ?? 'the sandbox is off.'}`
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
        model.addLocally(info);
        Notification.success(`Sandbox session ${info.id} created.`, { autoClose: 3000 });
        void model.refreshSoon();
        return info;
      } catch (error) {
        notifyError(`Could not create the session: ${describeError(error)}`);
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
      terminal.title.icon = sandboxIcon;
      shell.add(terminal, 'main');
      shell.activateById(terminal.id);
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

    panel = new SandboxPanel({
      model,
      actions: {
        newSession: () => void commands.execute(CommandIDs.newSession),
        openTerminal: id => void commands.execute(CommandIDs.openTerminal, { id }),
        openFiles: id => void commands.execute(CommandIDs.openFiles, { id }),
        destroy: id => void commands.execute(CommandIDs.destroy, { id })
      }
    });
    panel.title.icon = sandboxIcon;
    shell.add(panel, 'left', { rank: 250 });
    restorer?.add(panel, 'tai-sandbox-panel');

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
        CommandIDs.showPanel
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

export default plugin;
