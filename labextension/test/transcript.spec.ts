/**
 * Issue 55: "Save transcript": GET sessions/{id}/transcript.ipynb, saved into the Jupyter contents under a free
 * name (`<id>-transcript.ipynb`, then `-1`...), then opened; an error told, nothing saved. The client, the
 * sessions, the contents manager, the panel and the commands are the real ones; only fetch answers from a
 * script.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { Contents, ContentsManager } from '@jupyterlab/services';
import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import { SandboxClient } from '../src/api';
import { CommandIDs } from '../src/commands';
import { SessionsModel } from '../src/model';
import { SandboxPanel } from '../src/panel';
import { SandboxSessions } from '../src/sessions';
import { addTranscriptCommands, saveTranscript, transcriptName } from '../src/transcript';
import { IRecorded, LOCAL_STATUS, fakeSettings, json, sessionInfo } from './fakes';

const NOTEBOOK = {
  nbformat: 4,
  nbformat_minor: 5,
  metadata: { jupyter_tai_sandbox: { session: 'sbx-1', commands: 1, truncated: false } },
  cells: [{ cell_type: 'markdown', id: 'h', metadata: {}, source: '# Sandbox session `sbx-1`' }]
};

/** The sandbox API and jupyter_server's contents: `taken` files exist; PUTs are recorded. */
function server(taken: string[], transcript: Response | (() => Response) = () => json(NOTEBOOK)) {
  const route = (request: IRecorded) => {
    const url = new URL(request.url);
    if (url.pathname.endsWith('/api/sandbox/sessions/sbx-1/transcript.ipynb')) {
      return typeof transcript === 'function' ? transcript() : transcript;
    }
    if (url.pathname.endsWith('/api/sandbox/status')) {
      return json(LOCAL_STATUS);
    }
    if (url.pathname.endsWith('/api/sandbox/sessions')) {
      return json({ sessions: [sessionInfo('sbx-1')] });
    }
    const contents = url.pathname.split('/api/contents/')[1];
    if (contents !== undefined) {
      const path = decodeURIComponent(contents);
      const model = { name: path, path, type: 'notebook', created: '', last_modified: '', writable: true, mimetype: '' };
      if (request.method === 'PUT') {
        return json({ ...model, content: null, format: null }, 201);
      }
      if (taken.includes(path)) {
        return json({ ...model, content: null, format: null });
      }
      return json({ message: `No such file or directory: ${path}`, reason: null }, 404);
    }
    return json({ error: 'SandboxRequestError', message: `unexpected ${request.method} ${request.url}` }, 400);
  };
  return fakeSettings(Array.from({ length: 20 }, () => route));
}

function setUp(taken: string[], transcript?: Response | (() => Response)) {
  const { settings, requests } = server(taken, transcript);
  const sessions = new SandboxSessions({ client: new SandboxClient(settings), showPanel: () => undefined });
  const errors: string[] = [];
  sessions.notifyError = message => void errors.push(message);
  const manager = new ContentsManager({ serverSettings: settings });
  // the real manager; what it is asked to save is recorded (jsdom's fetch cannot read the File body it sends)
  const saved: [string, Partial<Contents.IModel>][] = [];
  const contents = {
    get: manager.get.bind(manager),
    save: (path: string, model: Partial<Contents.IModel> = {}) => {
      saved.push([path, model]);
      return manager.save(path, model);
    }
  };
  return { sessions, contents, requests, errors, saved };
}

const attached: Widget[] = [];
afterEach(() => {
  attached.splice(0).forEach(w => w.dispose());
});

describe('saving a transcript', () => {
  it('names the file after the session, only its safe characters', () => {
    expect(transcriptName('sbx-1')).toBe('sbx-1-transcript.ipynb');
    expect(transcriptName('sbx-1', 2)).toBe('sbx-1-transcript-2.ipynb');
    expect(transcriptName('a/b c')).toBe('a_b_c-transcript.ipynb');
  });

  it('saves the notebook under a free name as a notebook, then opens it', async () => {
    const { sessions, contents, requests, errors, saved } = setUp(['sbx-1-transcript.ipynb']);
    const opened: string[] = [];
    const path = await saveTranscript(sessions, contents, p => opened.push(p), 'sbx-1');
    expect(path).toBe('sbx-1-transcript-1.ipynb');
    expect(opened).toEqual(['sbx-1-transcript-1.ipynb']);
    expect(errors).toEqual([]);
    const put = requests.find(r => r.method === 'PUT')!;
    expect(new URL(put.url).pathname).toBe('/base/api/contents/sbx-1-transcript-1.ipynb');
    expect(saved).toEqual([['sbx-1-transcript-1.ipynb', { type: 'notebook', format: 'json', content: NOTEBOOK }]]);
    const get = requests.find(r => r.url.includes('transcript.ipynb') && r.method === 'GET')!;
    expect(get.headers.get('Authorization')).toBe('token secret-token');
  });

  it('tells an error and saves nothing', async () => {
    const { sessions, contents, requests, errors } = setUp(
      [],
      json({ error: 'SandboxNotFoundError', message: "no sandbox session 'sbx-1'" }, 404)
    );
    const opened: string[] = [];
    expect(await saveTranscript(sessions, contents, p => opened.push(p), 'sbx-1')).toBeNull();
    expect(opened).toEqual([]);
    expect(requests.some(r => r.method === 'PUT')).toBe(false);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/^Could not save the transcript of session sbx-1: .*no sandbox session 'sbx-1'/);
  });

  it('is a command on a session, and a button in its actions', async () => {
    const { sessions, contents, requests } = setUp([]);
    const commands = new CommandRegistry();
    const opened: unknown[] = [];
    commands.addCommand('docmanager:open', { execute: args => void opened.push(args) });
    addTranscriptCommands(commands, sessions, contents, null);
    expect(commands.label(CommandIDs.saveTranscript)).toBe('Save Transcript of a Sandbox Session');
    expect(await commands.execute(CommandIDs.saveTranscript, { id: 'sbx-1' })).toBe('sbx-1-transcript.ipynb');
    expect(opened).toEqual([{ path: 'sbx-1-transcript.ipynb', kernelPreference: { shouldStart: false } }]);

    const model = new SessionsModel({ client: sessions.client });
    const saved: string[] = [];
    const base = {
      newSession: () => undefined,
      openTerminal: () => undefined,
      openFiles: () => undefined,
      destroy: () => undefined,
      extendTtl: async () => undefined,
      extendTtlBy: () => undefined,
      setPaused: async () => undefined,
      fork: async () => undefined,
      openDocument: () => undefined
    };
    const panel = new SandboxPanel({ model, actions: { ...base, saveTranscript: async id => void saved.push(id) } });
    Widget.attach(panel, document.body);
    attached.push(panel);
    await model.refresh();
    const button = panel.node.querySelector(
      '.jp-TaiSandbox-session[data-session-id="sbx-1"] .jp-TaiSandbox-saveTranscript'
    ) as HTMLButtonElement;
    expect(button.hidden).toBe(false);
    expect(button.textContent).toBe('Save transcript');
    button.click();
    expect(saved).toEqual(['sbx-1']);
    expect(requests.filter(r => r.method === 'PUT')).toHaveLength(1);

    const without = new SandboxPanel({ model: new SessionsModel({ client: sessions.client }), actions: base });
    Widget.attach(without, document.body);
    attached.push(without);
    await (without as any)._model.refresh();
    const hidden = without.node.querySelector('.jp-TaiSandbox-saveTranscript') as HTMLButtonElement;
    expect(hidden.hidden).toBe(true);
  });
});
