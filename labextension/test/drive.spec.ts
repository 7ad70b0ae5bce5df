import { describe, expect, it } from 'vitest';

import { SandboxClient } from '../src/api';
import {
  SandboxDrive,
  base64ToBytes,
  bytesToBase64,
  copyName,
  decodeContent,
  defaultFormat,
  encodeContent,
  entryModel,
  joinDrivePath,
  parentOf,
  sessionModel,
  splitDrivePath,
  untitledName,
  untrustNotebook
} from '../src/drive';
import { SandboxAPIError } from '../src/request';
import { fakeSettings, json } from './fakes';

const SESSION = {
  id: 'sbx-1',
  kind: 'local',
  consumer: 'me',
  image: null,
  isolation: 'none',
  network: 'egress',
  durability: 'ephemeral',
  workspace_key: null,
  workspace: '/tmp/w',
  created_at: 1000,
  expires_at: 4600,
  seconds_left: 3600,
  spec: {}
} as const;

const API = 'http://lab.test/base/api/sandbox';

function bytes(text: string): Response {
  return new Response(new TextEncoder().encode(text), {
    status: 200,
    headers: { 'Content-Type': 'application/octet-stream' }
  });
}

describe('drive paths', () => {
  it('splits a drive path into the session and the workspace path', () => {
    expect(splitDrivePath('')).toEqual({ sessionId: '', path: '' });
    expect(splitDrivePath('/')).toEqual({ sessionId: '', path: '' });
    expect(splitDrivePath('sbx-1')).toEqual({ sessionId: 'sbx-1', path: '' });
    expect(splitDrivePath('sbx-1/a/./b.txt/')).toEqual({ sessionId: 'sbx-1', path: 'a/b.txt' });
    expect(() => splitDrivePath('sbx-1/../sbx-2/x')).toThrow(SandboxAPIError);
    expect(joinDrivePath('sbx-1', '')).toBe('sbx-1');
    expect(joinDrivePath('sbx-1', 'a/b.txt')).toBe('sbx-1/a/b.txt');
    expect(parentOf('a/b/c.txt')).toBe('a/b');
    expect(parentOf('c.txt')).toBe('');
  });

  it('turns sessions and entries into contents models', () => {
    const folder = sessionModel(SESSION as any);
    expect(folder).toMatchObject({ name: 'sbx-1', path: 'sbx-1', type: 'directory', content: null });
    expect(folder.created).toBe(new Date(1000 * 1000).toISOString());

    const nb = entryModel('sbx-1', 'sub', { name: 'a.ipynb', type: 'file', size: 12, mtime: 2 });
    expect(nb).toMatchObject({
      name: 'a.ipynb',
      path: 'sbx-1/sub/a.ipynb',
      type: 'notebook',
      size: 12,
      last_modified: new Date(2000).toISOString(),
      mimetype: 'application/x-ipynb+json'
    });
    const dir = entryModel('sbx-1', '', { name: 'data', type: 'directory', size: 4096 });
    expect(dir).toMatchObject({ path: 'sbx-1/data', type: 'directory', size: undefined });
    expect(entryModel('sbx-1', '', { name: 'x.txt', type: 'file', size: 1 }).type).toBe('file');
  });

  it('converts content both ways: text, base64, notebook JSON', () => {
    const utf8 = new TextEncoder().encode('héllo\n');
    expect(defaultFormat('file', utf8)).toBe('text');
    expect(defaultFormat('file', new Uint8Array([0xff, 0xfe, 0x00]))).toBe('base64');
    expect(defaultFormat('notebook', utf8)).toBe('json');
    expect(decodeContent(utf8, 'text', 'a')).toBe('héllo\n');
    expect(decodeContent(utf8, 'base64', 'a')).toBe(bytesToBase64(utf8));
    expect(Array.from(base64ToBytes(bytesToBase64(utf8)))).toEqual(Array.from(utf8));
    expect(() => decodeContent(utf8, 'json', 'a.ipynb')).toThrow(/not valid JSON/);

    const nb = { cells: [], metadata: {}, nbformat: 4, nbformat_minor: 5 };
    const saved = encodeContent(nb, 'json', 'notebook');
    expect(new TextDecoder().decode(saved)).toBe(JSON.stringify(nb, null, 1) + '\n');
    expect(decodeContent(saved, 'json', 'a.ipynb')).toEqual(nb);
    expect(new TextDecoder().decode(encodeContent('plain', 'text', 'file'))).toBe('plain');
    expect(Array.from(encodeContent(bytesToBase64(utf8), 'base64', 'file'))).toEqual(Array.from(utf8));
    expect(encodeContent(undefined, null, 'file').length).toBe(0);
  });

  it('picks free untitled and copy names as Jupyter does', () => {
    expect(untitledName([], 'file', '.txt')).toBe('untitled.txt');
    expect(untitledName(['untitled.txt'], 'file', 'txt')).toBe('untitled1.txt');
    expect(untitledName(['Untitled.ipynb', 'Untitled1.ipynb'], 'notebook', '')).toBe('Untitled2.ipynb');
    expect(untitledName(['Untitled Folder'], 'directory', '')).toBe('Untitled Folder 1');
    expect(copyName(['a.txt'], 'a.txt')).toBe('a-Copy1.txt');
    expect(copyName(['a-Copy1.txt'], 'a.txt')).toBe('a-Copy2.txt');
    expect(copyName([], 'b.tar.gz')).toBe('b-Copy1.tar.gz');
  });
});

describe('SandboxDrive', () => {
  it('lists the sessions as the top level', async () => {
    const { settings, requests } = fakeSettings([json({ sessions: [SESSION] })]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    const root = await drive.get('');
    expect(root.type).toBe('directory');
    expect(root.content.map((m: any) => m.path)).toEqual(['sbx-1']);
    expect(requests[0].url).toBe(`${API}/sessions`);
  });

  it('shows an empty top level when the server has no provider (503)', async () => {
    const { settings } = fakeSettings([
      json({ error: 'SandboxUnavailableError', message: "unknown sandbox provider 'dokcer'" }, 503)
    ]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    expect((await drive.get('')).content).toEqual([]);
  });

  it('lists a workspace folder through the files API', async () => {
    const { settings, requests } = fakeSettings([
      json({ path: '.', entries: [{ name: 'a b.txt', type: 'file', size: 3, mtime: 5 }] })
    ]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    const folder = await drive.get('sbx-1');
    expect(folder.content[0]).toMatchObject({ path: 'sbx-1/a b.txt', type: 'file' });
    expect(requests[0].url).toBe(`${API}/sessions/sbx-1/files`);
  });

  it('reads a file with its listing stat, in the format asked', async () => {
    const { settings, requests } = fakeSettings([
      json({ path: 'sub', entries: [{ name: 'n.txt', type: 'file', size: 5, mtime: 7 }] }),
      bytes('hello')
    ]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    const model = await drive.get('sbx-1/sub/n.txt', { type: 'file', format: 'text' });
    expect(model).toMatchObject({
      path: 'sbx-1/sub/n.txt',
      content: 'hello',
      format: 'text',
      last_modified: new Date(7000).toISOString()
    });
    expect(requests.map(r => r.url)).toEqual([
      `${API}/sessions/sbx-1/files/sub`,
      `${API}/sessions/sbx-1/files/sub/n.txt`
    ]);
  });

  it('answers 404 for a file its folder does not hold', async () => {
    const { settings } = fakeSettings([json({ path: '.', entries: [] })]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    await expect(drive.get('sbx-1/missing.txt')).rejects.toMatchObject({ status: 404 });
  });

  it('saves a notebook as JSON by PUT and reports the new stat', async () => {
    const { settings, requests } = fakeSettings([
      json({ path: 'n.ipynb', size: 10 }, 201),
      json({ path: '.', entries: [{ name: 'n.ipynb', type: 'file', size: 10, mtime: 9 }] })
    ]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    const changes: any[] = [];
    drive.fileChanged.connect((_, change) => changes.push(change));
    const nb = { cells: [], metadata: {}, nbformat: 4, nbformat_minor: 5 };
    const model = await drive.save('sbx-1/n.ipynb', { type: 'notebook', format: 'json', content: nb });
    expect(requests[0].method).toBe('PUT');
    expect(requests[0].url).toBe(`${API}/sessions/sbx-1/files/n.ipynb`);
    expect(JSON.parse(requests[0].body!)).toEqual(nb);
    expect(model).toMatchObject({ type: 'notebook', last_modified: new Date(9000).toISOString() });
    expect(changes[0].type).toBe('save');
  });

  it('deletes, renames and makes folders; refuses the session folders themselves', async () => {
    const { settings, requests } = fakeSettings([
      new Response(null, { status: 204 }),
      json({ path: 'b.txt' }),
      json({ path: '.', entries: [{ name: 'b.txt', type: 'file', size: 1, mtime: 1 }] }),
      json({ path: '.', entries: [{ name: 'Untitled Folder', type: 'directory', size: 0 }] }),
      json({ path: 'Untitled Folder 1', type: 'directory' }, 201),
      json({ path: '.', entries: [{ name: 'Untitled Folder 1', type: 'directory', size: 0 }] })
    ]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    await drive.delete('sbx-1/a.txt');
    const renamed = await drive.rename('sbx-1/a.txt', 'sbx-1/b.txt');
    const folder = await drive.newUntitled({ path: 'sbx-1', type: 'directory' });
    expect(requests[0]).toMatchObject({ method: 'DELETE', url: `${API}/sessions/sbx-1/files/a.txt` });
    expect(requests[1]).toMatchObject({ method: 'PATCH', url: `${API}/sessions/sbx-1/files/a.txt` });
    expect(JSON.parse(requests[1].body!)).toEqual({ path: 'b.txt' });
    expect(renamed.path).toBe('sbx-1/b.txt');
    expect(requests[4]).toMatchObject({ method: 'POST', url: `${API}/sessions/sbx-1/files/Untitled%20Folder%201` });
    expect(JSON.parse(requests[4].body!)).toEqual({ type: 'directory' });
    expect(folder.path).toBe('sbx-1/Untitled Folder 1');

    await expect(drive.delete('sbx-1')).rejects.toThrow(/destroy the session/);
    await expect(drive.rename('sbx-1', 'sbx-2')).rejects.toThrow(/cannot be renamed/);
    await expect(drive.rename('sbx-1/a', 'sbx-2/a')).rejects.toThrow(/between sessions/);
    await expect(drive.newUntitled({ path: '' })).rejects.toThrow(/inside a session folder/);
  });

  it('passes the server 409 on when a rename target exists', async () => {
    const { settings } = fakeSettings([
      json({ error: 'SandboxConflictError', message: 'b.txt exists' }, 409)
    ]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    await expect(drive.rename('sbx-1/a.txt', 'sbx-1/b.txt')).rejects.toMatchObject({
      status: 409,
      message: 'b.txt exists'
    });
  });

  it('reads a notebook a session marked trusted as untrusted (no cell trust, no signature)', async () => {
    const planted = {
      cells: [
        {
          cell_type: 'code',
          id: 'a',
          metadata: { trusted: true, tags: ['kept'] },
          execution_count: 1,
          source: '',
          outputs: [
            { output_type: 'display_data', metadata: {}, data: { 'text/html': '<script>x()</script>' } }
          ]
        },
        { cell_type: 'markdown', id: 'b', metadata: { trusted: true }, source: '<img src=x onerror=x()>' },
        { cell_type: 'raw', id: 'c', metadata: { trusted: 'yes' }, source: '' },
        { cell_type: 'code', id: 'd', source: '', outputs: [], execution_count: null }
      ],
      metadata: { signature: 'sha256:0123', kernelspec: { name: 'python3' } },
      nbformat: 4,
      nbformat_minor: 5
    };
    const text = JSON.stringify(planted);
    const entries = [{ name: 'evil.ipynb', type: 'file', size: text.length, mtime: 1 }];
    const { settings } = fakeSettings([
      json({ path: '.', entries }),
      bytes(text),
      // the same bytes asked for as a notebook under another name, and as generic JSON
      json({ path: '.', entries: [{ ...entries[0], name: 'evil.json' }] }),
      bytes(text),
      json({ path: '.', entries }),
      bytes(text)
    ]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    const asNotebook = await drive.get('sbx-1/evil.ipynb');
    const asTyped = await drive.get('sbx-1/evil.json', { type: 'notebook' });
    const asJson = await drive.get('sbx-1/evil.ipynb', { type: 'file', format: 'json' });
    for (const model of [asNotebook, asTyped, asJson]) {
      const nb = model.content;
      expect(nb.cells.map((c: any) => c.metadata?.trusted)).toEqual([undefined, undefined, undefined, undefined]);
      expect(nb.metadata).toEqual({ kernelspec: { name: 'python3' } });
      expect(nb.cells[0].metadata).toEqual({ tags: ['kept'] });
      expect(nb.cells[0].outputs).toEqual(planted.cells[0].outputs); // outputs kept, only untrusted
      expect(JSON.stringify(nb)).not.toMatch(/trusted|signature/);
    }
    expect(asNotebook.type).toBe('notebook');
  });

  it('never writes trust back when saving a notebook', async () => {
    const { settings, requests } = fakeSettings([
      json({ path: 'n.ipynb', size: 10 }, 201),
      json({ path: '.', entries: [{ name: 'n.ipynb', type: 'file', size: 10, mtime: 9 }] }),
      json({ path: 'n.json', size: 10 }, 201),
      json({ path: '.', entries: [{ name: 'n.json', type: 'file', size: 10, mtime: 9 }] })
    ]);
    const drive = new SandboxDrive(new SandboxClient(settings));
    // what JupyterLab's model saves after the user ran a cell or added one: trusted: true
    const nb = {
      cells: [
        { cell_type: 'code', id: 'a', metadata: { trusted: true, collapsed: false }, source: '1', outputs: [] },
        { cell_type: 'markdown', id: 'b', metadata: { trusted: true }, source: '' }
      ],
      metadata: { signature: 'sha256:00' },
      nbformat: 4,
      nbformat_minor: 5
    };
    const before = JSON.stringify(nb);
    await drive.save('sbx-1/n.ipynb', { type: 'notebook', format: 'json', content: nb });
    await drive.save('sbx-1/n.json', { type: 'file', format: 'json', content: nb });
    for (const request of [requests[0], requests[2]]) {
      expect(request.method).toBe('PUT');
      const written = JSON.parse(request.body!);
      expect(written.cells.map((c: any) => c.metadata)).toEqual([{ collapsed: false }, {}]);
      expect(written.metadata).toEqual({});
      expect(request.body).not.toMatch(/trusted/);
    }
    expect(JSON.stringify(nb)).toBe(before); // the caller's model is not changed
  });

  it('leaves text and non-notebook JSON alone', () => {
    const data = { cells: 'not a list', metadata: { trusted: true } };
    expect(untrustNotebook(data)).toBe(data);
    expect(untrustNotebook([{ metadata: { trusted: true } }])).toEqual([{ metadata: { trusted: true } }]);
    expect(untrustNotebook(null)).toBe(null);
    expect(untrustNotebook('{"cells": []}')).toBe('{"cells": []}');
  });
});
