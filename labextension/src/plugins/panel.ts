/**
 * The panel plugin: the Sandbox sidebar (SandboxPanel) and its Show command.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';

import { CommandIDs, addPanelCommands } from '../commands';
import { sandboxIcon } from '../icon';
import { SandboxPanel } from '../panel';
import { OPEN_PREVIEW, PreviewWidget, previewUrl, previewWidgetId } from '../previews';
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
        editEgress: id => void commands.execute(CommandIDs.egressPolicy, { id }),
        saveTranscript: id => commands.execute(CommandIDs.saveTranscript, { id }),
        listPorts: id => sessions.client.listPorts(id),
        openPreview: (id, port, ownOrigin) => void commands.execute(OPEN_PREVIEW, { id, port, ownOrigin: ownOrigin === true })
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

    // the preview tabs: one per session and port; a session destroyed here closes its tabs
    const previews = new WidgetTracker<PreviewWidget>({ namespace: 'tai-sandbox-preview' });
    commands.addCommand(OPEN_PREVIEW, {
      label: 'Open a Sandbox Session Port in a Tab',
      caption: "Open a web app listening in a sandbox session (its preview) in a JupyterLab tab",
      execute: args => {
        const id = typeof args.id === 'string' ? args.id : '';
        const port = Number(args.port);
        if (!id || !Number.isInteger(port) || port < 1 || port > 65535) {
          sessions.notifyError('Open a preview: give a session id and a port (1-65535).');
          return null;
        }
        const existing = previews.find(w => w.id === previewWidgetId(id, port));
        if (existing) {
          existing.content.reload();
          shell.activateById(existing.id);
          return existing;
        }
        const widget = new PreviewWidget({
          sessionId: id,
          port,
          url: previewUrl(sessions.client.serverSettings.baseUrl, id, port),
          ownOrigin: args.ownOrigin === true
        });
        void previews.add(widget);
        shell.add(widget, 'main');
        shell.activateById(widget.id);
        return widget;
      }
    });
    sessions.destroyed.connect((_, id) => {
      previews.forEach(w => {
        if (w.sessionId === id) {
          w.dispose();
        }
      });
    });

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
