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
  untitledName
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
});
