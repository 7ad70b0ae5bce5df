import { describe, expect, it } from 'vitest';

import { SandboxClient, filePathUrl } from '../src/api';
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
  created_at: 1,
  expires_at: 3601,
  seconds_left: 3600,
  spec: {}
};

describe('SandboxClient', () => {
  it('reads the status with the token, under the base URL', async () => {
    const { settings, requests } = fakeSettings([json({ kind: 'off', message: 'set TAI_MCP_SANDBOX' })]);
    const status = await new SandboxClient(settings).status();
    expect(status).toEqual({ kind: 'off', message: 'set TAI_MCP_SANDBOX' });
    expect(requests[0].url).toBe('http://lab.test/base/api/sandbox/status');
    expect(requests[0].headers.get('Authorization')).toBe('token secret-token');
  });

  it('creates a session by POSTing the spec as JSON', async () => {
    const { settings, requests } = fakeSettings([json(SESSION, 201)]);
    const info = await new SandboxClient(settings).createSession({ ttl_seconds: 60, image: null });
    expect(info.id).toBe('sbx-1');
    expect(requests[0].method).toBe('POST');
    expect(requests[0].url).toBe('http://lab.test/base/api/sandbox/sessions');
    expect(JSON.parse(requests[0].body!)).toEqual({ ttl_seconds: 60, image: null });
  });

  it('lists sessions and destroys one (204, empty body)', async () => {
    const { settings, requests } = fakeSettings([
      json({ sessions: [SESSION] }),
      new Response(null, { status: 204 })
    ]);
    const client = new SandboxClient(settings);
    expect(await client.listSessions()).toHaveLength(1);
    await client.destroySession('sbx/1', true);
    expect(requests[1].method).toBe('DELETE');
    expect(requests[1].url).toBe(
      'http://lab.test/base/api/sandbox/sessions/sbx%2F1?remove_workspace=1'
    );
  });

  it('turns a JSON error into a SandboxAPIError with the server message', async () => {
    const { settings } = fakeSettings([
      json(
        { error: 'SandboxSpecRejectedError', message: 'isolation vm is above what local gives' },
        400
      )
    ]);
    const error = await new SandboxClient(settings).createSession({}).catch(e => e);
    expect(error).toBeInstanceOf(SandboxAPIError);
    expect(error.status).toBe(400);
    expect(error.error).toBe('SandboxSpecRejectedError');
    expect(error.message).toBe('isolation vm is above what local gives');
    expect(error.unreachable).toBe(false);
  });

  it('reports a non-JSON error page readably', async () => {
    const { settings } = fakeSettings([
      new Response('<html>bad gateway</html>', { status: 502, statusText: 'Bad Gateway' })
    ]);
    const error = await new SandboxClient(settings).status().catch(e => e);
    expect(error.error).toBe('HTTPError');
    expect(error.message).toContain('502 Bad Gateway');
  });

  it('says the server cannot be reached when fetch fails', async () => {
    const { settings } = fakeSettings([new TypeError('Failed to fetch')]);
    const error = await new SandboxClient(settings).listSessions().catch(e => e);
    expect(error).toBeInstanceOf(SandboxAPIError);
    expect(error.unreachable).toBe(true);
    expect(error.message).toContain('Cannot reach the Jupyter server');
  });

  it('lists a folder and refuses a file as a folder', async () => {
    const listing = { path: 'data', entries: [{ name: 'a b.txt', type: 'file', size: 3, mtime: 1 }] };
    const { settings, requests } = fakeSettings([
      json(listing),
      new Response('abc', { headers: { 'Content-Type': 'application/octet-stream' } })
    ]);
    const client = new SandboxClient(settings);
    expect(await client.listFiles('sbx-1', '/data/')).toEqual(listing);
    expect(requests[0].url).toBe('http://lab.test/base/api/sandbox/sessions/sbx-1/files/data');
    await expect(client.listFiles('sbx-1', 'data/a b.txt')).rejects.toThrow('is a file');
    expect(requests[1].url).toBe(
      'http://lab.test/base/api/sandbox/sessions/sbx-1/files/data/a%20b.txt'
    );
  });

  it('lists the workspace itself at files (no trailing path)', async () => {
    const { settings, requests } = fakeSettings([json({ path: '.', entries: [] })]);
    await new SandboxClient(settings).listFiles('sbx-1');
    expect(requests[0].url).toBe('http://lab.test/base/api/sandbox/sessions/sbx-1/files');
  });

  it('uploads the raw body with PUT as octet-stream', async () => {
    const { settings, requests } = fakeSettings([json({ path: 'in/x.csv', size: 4 }, 201)]);
    const result = await new SandboxClient(settings).upload('sbx-1', 'in/x.csv', 'a,b\n');
    expect(result).toEqual({ path: 'in/x.csv', size: 4 });
    expect(requests[0].method).toBe('PUT');
    expect(requests[0].headers.get('Content-Type')).toBe('application/octet-stream');
    expect(requests[0].body).toBe('a,b\n');
  });

  it('maps 413 upload too large to a readable error', async () => {
    const { settings } = fakeSettings([
      json({ error: 'UploadTooLargeError', message: 'the upload is 9 bytes; the limit is 5' }, 413)
    ]);
    const error = await new SandboxClient(settings).upload('s', 'f', 'x'.repeat(9)).catch(e => e);
    expect(error.status).toBe(413);
    expect(error.message).toContain('the limit is 5');
  });

  it('builds the exec websocket URL from wsUrl and the token', () => {
    const { settings } = fakeSettings([]);
    expect(new SandboxClient(settings).execUrl('sbx-1')).toBe(
      'ws://lab.test/base/api/sandbox/sessions/sbx-1/exec/ws?token=secret-token'
    );
    const { settings: cookieOnly } = fakeSettings([], '');
    expect(new SandboxClient(cookieOnly).execUrl('sbx-1')).toBe(
      'ws://lab.test/base/api/sandbox/sessions/sbx-1/exec/ws'
    );
  });

  it('encodes workspace paths part by part', () => {
    expect(filePathUrl('/a b/./c#d/')).toBe('a%20b/c%23d');
    expect(filePathUrl('')).toBe('');
  });
});
