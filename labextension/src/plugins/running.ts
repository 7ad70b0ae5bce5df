/**
 * The running plugin: the sessions and the terminal tabs as sections of JupyterLab's Running
 * sidebar (destroy a session, shut a sandboxed kernel down, go to a terminal).
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { IRunningSessionManagers } from '@jupyterlab/running';

import { CommandIDs } from '../commands';
import { sandboxIcon } from '../icon';
import { describeError } from '../model';
import { SandboxSessionsRunning, SandboxTerminalsRunning } from '../running';
import { ISandboxSessions, ISandboxTerminalTracker } from '../tokens';

/** The id of JupyterLab's Running sidebar. */
const RUNNING_SIDEBAR_ID = 'jp-running-sessions';

export const runningPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-tai-sandbox:running',
  description: "Sandbox sessions and terminals in JupyterLab's Running sidebar.",
  autoStart: true,
  requires: [ISandboxSessions],
  optional: [IRunningSessionManagers, ISandboxTerminalTracker],
  activate: (
    app: JupyterFrontEnd,
    sessions: ISandboxSessions,
    runningManagers: IRunningSessionManagers | null,
    terminals: ISandboxTerminalTracker | null
  ) => {
    if (!runningManagers) {
      return;
    }
    const { commands, shell } = app;
    // the sessions show in the Running sidebar too: refresh them while it is open
    sessions.addView(() => {
      for (const area of ['left', 'right'] as const) {
        for (const widget of shell.widgets(area)) {
          if (widget.id === RUNNING_SIDEBAR_ID && widget.isVisible) {
            return true;
          }
        }
      }
      return false;
    });
    if (terminals) {
      runningManagers.add(
        new SandboxTerminalsRunning({
          forEach: fn => terminals.forEach(fn),
          widgetAdded: terminals.widgetAdded,
          activate: terminal => shell.activateById(terminal.id),
          icon: sandboxIcon
        })
      );
    }
    runningManagers.add(
      new SandboxSessionsRunning({
        model: sessions.model,
        icon: sandboxIcon,
        reveal: id => void commands.execute(CommandIDs.showPanel, { id }),
        destroy: id => sessions.destroyNow(id),
        shutdownKernel: async kernelId => {
          try {
            await app.serviceManager.kernels.shutdown(kernelId);
          } catch (error) {
            sessions.notifyError(`Could not shut down kernel ${kernelId}: ${describeError(error)}`);
            throw error;
          }
        }
      })
    );
  }
};
