/**
 * The panel plugin: the Sandbox sidebar (SandboxPanel) and its Show command.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';

import { CommandIDs, addPanelCommands } from '../commands';
import { sandboxIcon } from '../icon';
import { SandboxPanel } from '../panel';
import { ISandboxSessions } from '../tokens';

export const panelPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-tai-sandbox:panel',
  description: 'The Sandbox sidebar: the sessions, their state and their actions.',
  autoStart: true,
  requires: [ISandboxSessions],
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    sessions: ISandboxSessions,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const { commands, shell } = app;
    const panel = new SandboxPanel({
      model: sessions.model,
      actions: {
        newSession: () => void commands.execute(CommandIDs.newSession),
        openTerminal: id => void commands.execute(CommandIDs.openTerminal, { id }),
        openFiles: id => void commands.execute(CommandIDs.openFiles, { id }),
        destroy: id => void commands.execute(CommandIDs.destroy, { id }),
        extendTtl: async id => {
          await commands.execute(CommandIDs.extendTtl, { id });
        },
        extendTtlBy: id => void commands.execute(CommandIDs.extendTtlBy, { id }),
        setPaused: async (id, paused) => {
          await commands.execute(paused ? CommandIDs.pause : CommandIDs.resume, { id });
        },
        fork: async id => {
          await commands.execute(CommandIDs.fork, { id });
        },
        openDocument: path => void commands.execute('docmanager:open', { path }),
        editEgress: id => void commands.execute(CommandIDs.egressPolicy, { id })
      }
    });
    panel.title.icon = sandboxIcon;
    sessions.addView(() => panel.isVisible);
    sessions.errorChanged.connect((_, error) => {
      if (error) {
        panel.showError(error.title, error.message);
      } else {
        panel.clearError();
      }
    });
    shell.add(panel, 'left', { rank: 250 });
    restorer?.add(panel, 'tai-sandbox-panel');

    addPanelCommands(
      commands,
      sessionId => {
        shell.activateById(panel.id);
        if (sessionId) {
          panel.revealSession(sessionId);
        }
      },
      palette
    );
  }
};
