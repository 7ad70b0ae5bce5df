/**
 * "Save Transcript of a Sandbox Session": GET sessions/{id}/transcript.ipynb (the session's commands and their
 * output as a notebook, scrubbed and unsigned), saved into the Jupyter contents as `<id>-transcript.ipynb` (a
 * free name: `-1`, `-2`... when taken), then opened. The notebook opens untrusted: its outputs are text.
 */
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { Contents, ServerConnection } from '@jupyterlab/services';
import { CommandRegistry } from '@lumino/commands';

import { CommandIDs, PALETTE_CATEGORY, addOnSessionCommand } from './commands';
import { describeError } from './model';
import { ISandboxSessions } from './tokens';

/** How many `-N` names are tried before giving up. */
const MAX_TRIES = 100;

/** The file name a transcript of session `id` is saved under (only the id's safe characters). */
export function transcriptName(id: string, n = 0): string {
  const safe = id.replace(/[^A-Za-z0-9._-]/g, '_').slice(0, 128) || 'session';
  return `${safe}-transcript${n ? `-${n}` : ''}.ipynb`;
}

/** A path in `folder` no file holds yet, for the transcript of `id`. */
export async function freeTranscriptPath(
  contents: Pick<Contents.IManager, 'get'>,
  id: string,
  folder = ''
): Promise<string> {
  for (let n = 0; n < MAX_TRIES; n++) {
    const path = folder ? `${folder.replace(/\/+$/, '')}/${transcriptName(id, n)}` : transcriptName(id, n);
    try {
      await contents.get(path, { content: false });
    } catch (error) {
      if (error instanceof ServerConnection.ResponseError && error.response.status === 404) {
        return path; // not there: free
      }
      throw error;
    }
  }
  throw new Error(`${transcriptName(id)} and its next ${MAX_TRIES - 1} numbered names are all taken`);
}

/**
 * Fetch the transcript of session `id`, save it (a free name in `folder`), open it; the saved path, or null
 * when it could not (the error told).
 */
export async function saveTranscript(
  sessions: ISandboxSessions,
  contents: Pick<Contents.IManager, 'get' | 'save'>,
  open: (path: string) => unknown,
  id: string,
  folder = ''
): Promise<string | null> {
  try {
    const notebook = await sessions.client.transcript(id);
    const path = await freeTranscriptPath(contents, id, folder);
    await contents.save(path, { type: 'notebook', format: 'json', content: notebook });
    const meta = notebook.metadata?.jupyter_tai_sandbox;
    const truncated = meta?.truncated ? ' (its oldest output was dropped: the header says how much)' : '';
    Notification.success(`The transcript of sandbox session ${id} is saved as ${path}${truncated}.`, {
      autoClose: 5000
    });
    open(path);
    return path;
  } catch (error) {
    sessions.notifyError(`Could not save the transcript of session ${id}: ${describeError(error)}`);
    return null;
  }
}

/** The command: on `args.id` or a session the user picks. */
export function addTranscriptCommands(
  commands: CommandRegistry,
  sessions: ISandboxSessions,
  contents: Pick<Contents.IManager, 'get' | 'save'>,
  palette: ICommandPalette | null
): void {
  addOnSessionCommand(commands, sessions, CommandIDs.saveTranscript, {
    label: 'Save Transcript of a Sandbox Session',
    caption: "Save a sandbox session's commands and their output as a notebook, and open it",
    verb: 'save the transcript of',
    none: null,
    // a record, not a program: opened without starting a kernel (nor asking for one)
    run: id =>
      saveTranscript(
        sessions,
        contents,
        path => commands.execute('docmanager:open', { path, kernelPreference: { shouldStart: false } }),
        id
      )
  });
  palette?.addItem({ command: CommandIDs.saveTranscript, category: PALETTE_CATEGORY });
}
