import { describe, expect, it } from 'vitest';

import { ISessionInfo, SandboxClient } from '../src/api';
import {
  EXTEND_SECONDS,
  currentTtl,
  extendedTtl,
  formatBytes,
  formatCpu,
  kernelIdOf,
  kernelServesText,
  usageText,
  usageTitle,
  usersByKernel
} from '../src/kernels';
import { SessionsModel, hasKernelSessions, stateFromFetch } from '../src/model';
import { SandboxAPIError } from '../src/request';
import { LOCAL_STATUS, fakeSettings, json, sessionInfo } from './fakes';

function session(id: string, consumer = 'me', created = 1000, ttl = 3600): ISessionInfo {
  return sessionInfo(id, { consumer, created, ttl });
}

const LOCAL = LOCAL_STATUS;

/** jupyter_server's GET /api/sessions rows, as it answers them. */
const JUPYTER_SESSIONS = [
  {
    id: 's1',
    path: 'work/analysis.ipynb',
    name: 'analysis.ipynb',
    type: 'notebook',
    kernel: { id: 'k-1', name: 'python3-sandbox' },
    notebook: { path: 'work/analysis.ipynb', name: 'analysis.ipynb' }
  },
  { id: 's2', path: 'console-1', name: 'Console 1', type: 'console', kernel: { id: 'k-1', name: 'python3-sandbox' } },
  { id: 's3', path: 'other.ipynb', name: 'other.ipynb', type: 'notebook', kernel: { id: 'k-2', name: 'python3' } },
  { id: 's4', path: 'nokernel.ipynb', name: 'nokernel.ipynb', type: 'notebook', kernel: null }
];

describe('kernel sessions', () => {
  it('reads the kernel id from the consumer label kernel:<id> only', () => {
    expect(kernelIdOf('kernel:0b9c-11')).toBe('0b9c-11');
    expect(kernelIdOf('kernel:')).toBeNull();
    expect(kernelIdOf('me')).toBeNull();
    expect(kernelIdOf('mcp:kernel:x')).toBeNull();
    expect(kernelIdOf(undefined)).toBeNull();
    expect(hasKernelSessions([session('a'), session('b', 'kernel:k-1')])).toBe(true);
    expect(hasKernelSessions([session('a')])).toBe(false);
  });

  it('maps kernel ids to the documents jupyter_server says use them', () => {
    const users = usersByKernel(JUPYTER_SESSIONS);
    expect(Object.keys(users).sort()).toEqual(['k-1', 'k-2']);
    expect(users['k-1']).toEqual([
      { path: 'console-1', name: 'Console 1', type: 'console' },
      { path: 'work/analysis.ipynb', name: 'analysis.ipynb', type: 'notebook' }
    ]);
    expect(usersByKernel({ not: 'a list' })).toEqual({});
    expect(usersByKernel([null, { kernel: { id: '' } }])).toEqual({});
    // an older server: the path only under `notebook`
    expect(usersByKernel([{ kernel: { id: 'k' }, notebook: { path: 'a/b.ipynb' } }])).toEqual({
      k: [{ path: 'a/b.ipynb', name: 'b.ipynb', type: 'notebook' }]
    });
  });

  it('says what a kernel serves', () => {
    expect(kernelServesText(undefined)).toBe('no notebook (yet)');
    expect(kernelServesText(usersByKernel(JUPYTER_SESSIONS)['k-1'])).toBe(
      'console-1 (console), work/analysis.ipynb'
    );
  });

  it('looks the notebooks up in /api/sessions only when a kernel session is listed', async () => {
    const { settings, requests } = fakeSettings([
      json(LOCAL),
      json({ sessions: [session('a'), session('b', 'kernel:k-1', 2000)] }),
      json(JUPYTER_SESSIONS),
      json(LOCAL),
      json({ sessions: [session('a')] })
    ]);
    const model = new SessionsModel({ client: new SandboxClient(settings) });
    const state = await model.refresh();
    expect(state.kernels['k-1'].map(u => u.path)).toEqual(['console-1', 'work/analysis.ipynb']);
    expect(requests[2].url).toBe('http://lab.test/base/api/sessions');
    expect(requests[2].headers.get('Authorization')).toBe('token secret-token');
    expect((await model.refresh()).kernels).toEqual({});
    expect(requests).toHaveLength(5);
    model.dispose();
  });

  it('keeps the last known notebooks when /api/sessions fails', async () => {
    const { settings } = fakeSettings([
      json(LOCAL),
      json({ sessions: [session('b', 'kernel:k-1')] }),
      json(JUPYTER_SESSIONS),
      json(LOCAL),
      json({ sessions: [session('b', 'kernel:k-1')] }),
      new Response('boom', { status: 500 })
    ]);
    const model = new SessionsModel({ client: new SandboxClient(settings) });
    await model.refresh();
    const state = await model.refresh();
    expect(state.connection).toBe('ok');
    expect(state.kernels['k-1']).toHaveLength(2);
    model.dispose();
  });
});

describe('+30 min', () => {
  it('asks for the current TTL (from creation) plus 30 minutes', () => {
    expect(EXTEND_SECONDS).toBe(1800);
    const s = session('a', 'me', 1000.25, 3600);
    expect(currentTtl(s)).toBe(3600);
    expect(extendedTtl(s)).toBe(5400);
    // extended before: expires_at moved, the TTL with it
    expect(extendedTtl({ created_at: 10, expires_at: 10 + 5400.5 })).toBe(7201);
    expect(extendedTtl({ created_at: 10, expires_at: 5 }, 60)).toBe(60);
  });

  it('PATCHes the session with ttl_seconds and reports a refusal whole', async () => {
    const message =
      'ttl_seconds: 90000 s is over the operator\'s maximum of 86400 s (SandboxPolicy.max_ttl_seconds, TAI_MCP_SANDBOX_MAX_TTL_SECONDS)';
    const { settings, requests } = fakeSettings([
      json({ ...session('sbx-1', 'me', 1, 5400) }),
      json({ error: 'SandboxRequestError', message, field: 'ttl_seconds' }, 400)
    ]);
    const client = new SandboxClient(settings);
    expect((await client.setTtl('sbx-1', 5400)).expires_at).toBe(5401);
    expect(requests[0].method).toBe('PATCH');
    expect(requests[0].url).toBe('http://lab.test/base/api/sandbox/sessions/sbx-1');
    expect(JSON.parse(requests[0].body!)).toEqual({ ttl_seconds: 5400 });
    const refused = await client.setTtl('sbx-1', 90000).catch(e => e);
    expect(refused).toBeInstanceOf(SandboxAPIError);
    expect(refused.status).toBe(400);
    expect(refused.message).toBe(message);
  });

  it('replaces a row with the server answer, counting down from now', async () => {
    const { settings } = fakeSettings([json(LOCAL), json({ sessions: [session('a', 'me', 1000, 600)] })]);
    const model = new SessionsModel({ client: new SandboxClient(settings) });
    await model.refresh();
    const at = model.state.fetchedAt;
    model.updateLocally({ ...session('a', 'me', 1000, 2400), seconds_left: 2400 }, at + 2000);
    expect(model.find('a')!.expires_at).toBe(3400);
    model.updateLocally(session('gone'), at);
    expect(model.find('gone')).toBeUndefined();
    model.dispose();
  });
});

describe('usage', () => {
  it('formats sizes and CPU time compactly', () => {
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(20 * 1024 * 1024)).toBe('20 MiB');
    expect(formatBytes(-1)).toBe('?');
    expect(formatCpu(1.2)).toBe('1.20 s');
    expect(formatCpu(42.4)).toBe('42 s');
    expect(formatCpu(200)).toBe('3m 20s');
  });

  it('shows what was measured and leaves out what was not', () => {
    expect(
      usageText({
        cpu_seconds: 1.2,
        memory_bytes: 20 * 1024 * 1024,
        memory_limit_bytes: 512 * 1024 * 1024,
        disk_bytes: 4096,
        disk_partial: false,
        note: null
      })
    ).toBe('cpu 1.20 s · mem 20 MiB / 512 MiB · disk 4.0 KiB');
    const local = {
      cpu_seconds: null,
      memory_bytes: null,
      memory_limit_bytes: null,
      disk_bytes: 100,
      disk_partial: true,
      note: 'the local provider measures disk only: CPU and memory are not per session',
      measured_at: 1
    };
    expect(usageText(local)).toBe('disk ≥ 100 B');
    expect(usageTitle(local)).toContain('measures disk only');
    expect(usageTitle(local)).toContain('lower bound');
    expect(usageText({ note: 'usage could not be measured: engine down' })).toBe('not measured');
    expect(usageText({})).toBeNull();
    expect(usageText(undefined)).toBeNull();
  });

  it('fetches the usage of every session in one request and forgets sessions that are gone', async () => {
    const measured = { disk_bytes: 2048, note: null };
    const entry = (id: string) => ({
      id,
      owner: 'me',
      consumer: 'user:me',
      serves: { kind: 'user', name: 'me' },
      paused: false,
      samples: [{ time: 1, cpu: null, memory_bytes: null, disk_bytes: 2048 }],
      last: measured
    });
    const { settings, requests } = fakeSettings([
      json(LOCAL),
      json({ sessions: [session('a'), session('b')] }),
      json({ interval_seconds: 5, samples_kept: 60, sampling: true, sessions: [entry('a'), entry('z')] }),
      json(LOCAL),
      json({ sessions: [session('b')] })
    ]);
    const model = new SessionsModel({ client: new SandboxClient(settings) });
    await model.refresh();
    await model.refreshUsage();
    // one GET usage for all of them (no request per session); a session the listing lacks is left out
    expect(requests.slice(2).map(r => `${r.method} ${r.url}`)).toEqual(['GET http://lab.test/base/api/sandbox/usage']);
    expect(model.state.usage).toEqual({ a: measured });
    expect(Object.keys(model.state.history)).toEqual(['a']);
    expect(model.state.history.a.samples).toHaveLength(1);
    const next = await model.refresh();
    expect(next.usage).toEqual({});
    expect(next.history).toEqual({});
    expect(stateFromFetch(LOCAL as any, [session('a')], 1, { usage: { a: measured, z: measured } }).usage).toEqual({
      a: measured
    });
    model.dispose();
  });
});
