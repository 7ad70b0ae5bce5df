/**
 * The sessions plugin: the client, the polled model and the user's settings, shared as
 * ISandboxSessions, with the session commands (New, Destroy, Extend) and their notifications.
 * It keeps the id the single plugin had: schema/plugin.json is its settings schema.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { SandboxClient } from '../api';
import { CommandIDs, addSessionCommands } from '../commands';
import { addEgressCommands } from '../egress';
import { SandboxSessions } from '../sessions';
import { SETTINGS_PLUGIN_ID, readSettings } from '../settings';
import { ISandboxSessions } from '../tokens';
import { addTranscriptCommands } from '../transcript';

export const sessionsPlugin: JupyterFrontEndPlugin<ISandboxSessions> = {
  id: SETTINGS_PLUGIN_ID,
  description: 'Sandbox sessions: the client, the refreshed list and the session commands.',
  autoStart: true,
  provides: ISandboxSessions,
  optional: [ICommandPalette, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null
  ): ISandboxSessions => {
    const { commands } = app;
    const sessions = new SandboxSessions({
      client: new SandboxClient(app.serviceManager.serverSettings),
      showPanel: () => void commands.execute(CommandIDs.showPanel)
    });
    addSessionCommands(commands, sessions, palette);
    addEgressCommands(commands, sessions, palette);
    addTranscriptCommands(commands, sessions, app.serviceManager.contents, palette);

    if (settingRegistry) {
      settingRegistry
        .load(SETTINGS_PLUGIN_ID)
        .then(loaded => {
          const apply = () => sessions.setSettings(readSettings(loaded));
          apply();
          loaded.changed.connect(apply);
        })
        .catch(reason => {
          console.warn('jupyter-tai-sandbox: cannot load settings, using defaults', reason);
        });
    }

    sessions.model.start();
    return sessions;
  }
};
