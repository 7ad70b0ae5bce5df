/**
 * The terminals plugin: terminal tabs into a session (a command on a pty), tracked so that a
 * page reload reattaches them by their session and exec id; shared as ISandboxTerminalTracker.
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin,
  LayoutRestorer
} from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';

import { CommandIDs, addTerminalCommands } from '../commands';
import { sandboxIcon } from '../icon';
import { SandboxTerminal } from '../terminal';
import { ISandboxSessions, ISandboxTerminalTracker } from '../tokens';

export const terminalsPlugin: JupyterFrontEndPlugin<ISandboxTerminalTracker> = {
  id: 'jupyter-tai-sandbox:terminals',
  description: 'Terminal tabs into sandbox sessions, reattached after a page reload.',
  autoStart: true,
  requires: [ISandboxSessions],
  optional: [ICommandPalette, ILayoutRestorer],
  provides: ISandboxTerminalTracker,
  activate: (
    app: JupyterFrontEnd,
    sessions: ISandboxSessions,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ): ISandboxTerminalTracker => {
    const { commands, shell } = app;
    const { client } = sessions;
    const terminals = new WidgetTracker<SandboxTerminal>({ namespace: 'tai-sandbox-terminal' });
    if (restorer) {
      void restorer.restore(terminals, {
        command: CommandIDs.restoreTerminal,
        args: widget => ({ sessionId: widget.sessionId, execId: widget.execId }),
        name: widget => widget.execId ?? widget.id
      });
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

    addTerminalCommands(
      commands,
      sessions,
      {
        open: async id => {
          const info = await sessions.fetchSession(id, 'open a terminal');
          if (!info) {
            return null;
          }
          const terminal = new SandboxTerminal({
            client,
            sessionId: id,
            // its deadline: the session's TTL left, at most the operator's maximum (asked at each start)
            argv: sessions.settings.terminalCommand
          });
          track(terminal);
          shell.add(terminal, 'main');
          shell.activateById(terminal.id);
          return terminal;
        },
        // a terminal tab brought back by the layout restorer: attach to its command again
        restore: (sessionId, execId) => {
          const terminal = new SandboxTerminal({
            client,
            sessionId,
            execId,
            argv: sessions.settings.terminalCommand
          });
          track(terminal, true);
          shell.add(terminal, 'main', { activate: false });
          return terminal;
        }
      },
      palette
    );
    return terminals;
  }
};
