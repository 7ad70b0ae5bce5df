/**
 * The files plugin: a session's workspace in a tab of its own (SandboxFiles), one per session,
 * closed when this page destroys the session.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';

import { addFilesCommands } from '../commands';
import { SandboxFiles } from '../files';
import { sandboxIcon } from '../icon';
import { ISandboxSessions } from '../tokens';

export const filesPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-tai-sandbox:files',
  description: "A sandbox session's workspace in a tab: list, upload, download, delete.",
  autoStart: true,
  requires: [ISandboxSessions],
  optional: [ICommandPalette],
  activate: (app: JupyterFrontEnd, sessions: ISandboxSessions, palette: ICommandPalette | null) => {
    const { shell } = app;
    const files = new Map<string, SandboxFiles>();
    sessions.destroyed.connect((_, id) => files.get(id)?.dispose());

    const open = async (id: string): Promise<SandboxFiles | null> => {
      const existing = files.get(id);
      if (existing && !existing.isDisposed) {
        shell.activateById(existing.id);
        void existing.refresh();
        return existing;
      }
      const info = await sessions.fetchSession(id, 'browse the files');
      if (!info) {
        return null;
      }
      const widget = new SandboxFiles({ client: sessions.client, sessionId: id });
      widget.title.icon = sandboxIcon;
      files.set(id, widget);
      widget.disposed.connect(() => files.delete(id));
      shell.add(widget, 'main');
      shell.activateById(widget.id);
      return widget;
    };
    addFilesCommands(app.commands, sessions, open, palette);
  }
};
