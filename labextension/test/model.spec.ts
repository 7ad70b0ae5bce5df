import { describe, expect, it } from 'vitest';

import { ISessionInfo, SandboxClient } from '../src/api';
import {
  INITIAL_STATE,
  SessionsModel,
  formatDuration,
  secondsLeft,
  stateFromError,
  stateFromFetch,
  statusLine,
  transitionNotice
} from '../src/model';
import { SandboxAPIError } from '../src/request';
import { LOCAL_STATUS, fakeSettings, json, sessionInfo } from './fakes';

function session(id: string, created: number, left = 600): ISessionInfo {
  return sessionInfo(id, { created, ttl: left });
}

const LOCAL = LOCAL_STATUS;
const OFF = { kind: 'off', message: 'no sandbox provider is installed: set TAI_MCP_SANDBOX' };

describe('state logic', () => {
  it('sorts sessions newest first and summarises the kind row', () => {
    const state = stateFromFetch(LOCAL as any, [session('a', 1), session('b', 5)], 1000);
    expect(state.connection).toBe('ok');
    expect(state.sessions.map(s => s.id)).toEqual(['b', 'a']);
    expect(statusLine(state)).toBe('Provider local · isolation floor none · network ceiling egress');
  });

  it('shows the off message and no sessions when the provider is off', () => {
    const state = stateFromFetch(OFF, [session('a', 1)], 1000);
    expect(state.connection).toBe('off');
    expect(state.sessions).toEqual([]);
    expect(statusLine(state)).toContain('TAI_MCP_SANDBOX');
  });

  it('keeps what it knew when the server is unreachable, and says so once', () => {
    const ok = stateFromFetch(LOCAL as any, [session('a', 1)], 1000);
    const lost = stateFromError(ok, new SandboxAPIError(0, 'NetworkError', 'Cannot reach the Jupyter server (x).'));
    expect(lost.connection).toBe('unreachable');
    expect(lost.sessions).toHaveLength(1);
    expect(statusLine(lost)).toContain('Cannot reach');
    expect(transitionNotice(ok, lost)?.level).toBe('error');
    expect(transitionNotice(lost, stateFromError(lost, new SandboxAPIError(0, 'NetworkError', 'x')))).toBeNull();
    const back = stateFromFetch(LOCAL as any, [], 2000);
    expect(transitionNotice(lost, back)).toEqual({
      level: 'success',
      message: 'Sandbox panel: the server answers again.'
    });
  });

  it('tells a server error apart from an unreachable server', () => {
    const failed = stateFromError(INITIAL_STATE, new SandboxAPIError(500, 'InternalError', 'Internal Server Error'));
    expect(failed.connection).toBe('error');
    expect(failed.problem).toBe('Internal Server Error');
  });

  it('notices a provider that went off', () => {
    const ok = stateFromFetch(LOCAL as any, [], 1);
    expect(transitionNotice(ok, stateFromFetch(OFF, [], 2))?.message).toContain('TAI_MCP_SANDBOX');
    expect(transitionNotice(INITIAL_STATE, stateFromFetch(OFF, [], 2))).toBeNull();
  });

  it('counts time left down from the fetch, never below zero', () => {
    const s = session('a', 0, 100);
    expect(secondsLeft(s, 10_000, 10_000)).toBe(100);
    expect(secondsLeft(s, 10_000, 40_000)).toBe(70);
    expect(secondsLeft(s, 10_000, 500_000)).toBe(0);
  });

  it('formats durations for people', () => {
    expect(formatDuration(0)).toBe('expired');
    expect(formatDuration(45.9)).toBe('45s');
    expect(formatDuration(725)).toBe('12m 05s');
    expect(formatDuration(3 * 3600 + 20 * 60)).toBe('3h 20m');
    expect(formatDuration(2 * 86400 + 4 * 3600)).toBe('2d 4h');
  });
});

describe('SessionsModel', () => {
  it('refreshes status then sessions, and skips the list when off', async () => {
    const { settings, requests } = fakeSettings([
      json(LOCAL),
      json({ sessions: [session('a', 1)] }),
      json(OFF)
    ]);
    const model = new SessionsModel({ client: new SandboxClient(settings) });
    const seen: string[] = [];
    model.changed.connect((_, state) => seen.push(state.connection));
    expect((await model.refresh()).sessions.map(s => s.id)).toEqual(['a']);
    expect((await model.refresh()).connection).toBe('off');
    expect(requests.map(r => r.url.split('/api/sandbox/')[1])).toEqual(['status', 'sessions', 'status']);
    expect(seen).toEqual(['ok', 'off']);
    model.dispose();
  });

  it('emits one notice when the server goes and one when it comes back', async () => {
    const down = new TypeError('Failed to fetch');
    const { settings } = fakeSettings([json(LOCAL), json({ sessions: [] }), down, down, json(LOCAL), json({ sessions: [] })]);
    const model = new SessionsModel({ client: new SandboxClient(settings) });
    const notices: string[] = [];
    model.notice.connect((_, n) => notices.push(n.level));
    await model.refresh();
    await model.refresh();
    await expect(model.refresh(true)).rejects.toBeInstanceOf(SandboxAPIError);
    await model.refresh();
    expect(notices).toEqual(['error', 'success']);
    model.dispose();
  });

  it('adds and removes sessions locally between polls', async () => {
    const { settings } = fakeSettings([json(LOCAL), json({ sessions: [session('a', 1)] })]);
    const model = new SessionsModel({ client: new SandboxClient(settings) });
    await model.refresh();
    const fetchedAt = model.state.fetchedAt;
    model.addLocally(session('b', 9, 300), fetchedAt + 5000);
    expect(model.state.sessions.map(s => s.id)).toEqual(['b', 'a']);
    // created 5 s after the fetch with 300 s left: the countdown from the fetch agrees
    expect(secondsLeft(model.find('b')!, fetchedAt, fetchedAt + 5000)).toBe(300);
    model.removeLocally('a');
    expect(model.state.sessions.map(s => s.id)).toEqual(['b']);
    model.dispose();
  });
});

describe('JSON errors', () => {
  it('shows a 503 JSON error whole, as unavailable, with no "retrying" toast', () => {
    const message =
      "the sandbox provider 'dokcer' (SandboxApp.provider) could not start: unknown sandbox provider 'dokcer'";
    const error = new SandboxAPIError(503, 'SandboxUnavailableError', message);
    const state = stateFromError(INITIAL_STATE, error);
    expect(state.connection).toBe('unavailable');
    expect(statusLine(state)).toBe(message);
    const notice = transitionNotice(INITIAL_STATE, state)!;
    expect(notice.showPanel).toBe(true);
    expect(notice.message).not.toMatch(/404|Retrying/);
  });
});
