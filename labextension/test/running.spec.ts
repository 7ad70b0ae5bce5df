/**
 * Issue 25 points 8, 9, 12, 14, 15: what the panel says before a click (New session off and
 * why, no isolation, the operator's cpu/memory defaults, "+30 min" at the maximum TTL), and
 * the Running sidebar's sandbox sections.
 */
import { describe, expect, it } from 'vitest';
import { Signal } from '@lumino/signaling';
import type { LabIcon } from '@jupyterlab/ui-components';

import { IStatus, SandboxClient } from '../src/api';
import { extendBlockedReason } from '../src/kernels';
import {
  NO_ISOLATION,
  SessionsModel,
  createBlockedReason,
  formatMemoryMb,
  isolationWarning,
  limitHints
} from '../src/model';
import { IRunningTerminal, SandboxSessionsRunning, SandboxTerminalsRunning, sessionRow } from '../src/running';
import { fakeSettings, json, sessionInfo } from './fakes';

const policy = (isolation: 'none' | 'container', max_ttl_seconds = 0) => ({
  isolation,
  egress: 'egress' as const,
  durable: true,
  scrub_transcript: false,
  credentials: {},
  max_ttl_seconds
});

const LOCAL: IStatus = { kind: 'local', max_isolation: 'none', supports_limits: false, policy: policy('none') };
const DOCKER: IStatus = {
  kind: 'docker',
  max_isolation: 'container',
  supports_limits: true,
  limits: { default_cpu: 1, max_cpu: 2, default_memory_mb: 1024, max_memory_mb: 4096 },
  policy: policy('container')
};
/** An icon stands in: the managers only hand it to the sidebar. */
const icon = { name: 'tai-test:icon' } as unknown as LabIcon;

describe('New session before the click', () => {
  it('is off with the server\'s reason when the floor is over what the provider gives', () => {
    const refused = { ...LOCAL, policy: policy('container'), create_refused: 'every session create is refused: X' };
    expect(createBlockedReason(refused)).toBe('every session create is refused: X');
    // an older server without create_refused: the same facts, the server's option named
    const older = { ...LOCAL, policy: policy('container') };
    expect(createBlockedReason(older)).toContain('--SandboxPolicy.isolation=none');
    expect(createBlockedReason(older)).toContain('TAI_MCP_SANDBOX_ISOLATION=none');
    expect(createBlockedReason(LOCAL)).toBeNull();
    expect(createBlockedReason(DOCKER)).toBeNull();
    expect(createBlockedReason({ kind: 'off' })).toBeNull();
  });

  it('says there is no isolation on the local provider only', () => {
    expect(isolationWarning(LOCAL)).toBe(NO_ISOLATION);
    expect(NO_ISOLATION).toContain('code runs on this host as you');
    expect(isolationWarning(DOCKER)).toBeNull();
    // refused anyway: the refusal is what to say
    expect(isolationWarning({ ...LOCAL, policy: policy('container') })).toBeNull();
  });

  it("says a vm provider's isolation is emulated in the provider's own words", () => {
    const vm: IStatus = {
      ...DOCKER,
      kind: 'vm',
      max_isolation: 'vm',
      isolation_note: 'emulated: a separate guest kernel, not a hardened boundary'
    };
    expect(isolationWarning(vm)).toBe('Isolation: emulated: a separate guest kernel, not a hardened boundary.');
    expect(isolationWarning({ ...vm, isolation_note: undefined })).toBeNull();
  });

  it("shows the operator's cpu/memory defaults and maxima, not 'no limit'", () => {
    const hints = limitHints(DOCKER);
    expect(hints.cpu.placeholder).toBe('default 1 CPU');
    expect(hints.cpu.hint).toBe("empty: 1 CPU, at most 2 CPUs (the operator's settings)");
    expect(hints.memory.placeholder).toBe('default 1 GiB');
    expect(hints.memory.hint).toBe("empty: 1 GiB, at most 4 GiB (the operator's settings)");
    const unlimited = limitHints({ ...DOCKER, limits: { default_cpu: 0, max_cpu: 0 } });
    expect(unlimited.cpu.placeholder).toBe('no limit');
    expect(unlimited.cpu.hint).toContain('no maximum');
    // a default over the maximum is capped as the provider caps it
    expect(limitHints({ ...DOCKER, limits: { default_cpu: 4, max_cpu: 2 } }).cpu.placeholder).toBe('default 2 CPUs');
    expect(limitHints(LOCAL).cpu.placeholder).toBe('not supported');
    expect(formatMemoryMb(1536)).toBe('1536 MB');
  });

  it('turns "+30 min" off, saying why, when it would go over the maximum TTL', () => {
    const at = { created_at: 1000, expires_at: 1000 + 3000 };
    expect(extendBlockedReason(at, 3000)).toContain('already has the operator\'s maximum TTL of 3000 s');
    expect(extendBlockedReason(at, 3000)).toContain('SandboxPolicy.max_ttl_seconds');
    const short = { created_at: 1000, expires_at: 1000 + 2700 };
    expect(extendBlockedReason(short, 3000)).toContain('would make its TTL 4500 s');
    expect(extendBlockedReason({ created_at: 1000, expires_at: 1900 }, 3000)).toBeNull();
    expect(extendBlockedReason(at, 0)).toBeNull();
    expect(extendBlockedReason(at, undefined)).toBeNull();
  });
});

class FakeTerminal implements IRunningTerminal {
  constructor(
    readonly id: string,
    readonly sessionId: string
  ) {}
  title = { label: `Sandbox ${this.sessionId}`, caption: 'Terminal', changed: new Signal<any, any>(this) };
  disposed = new Signal<any, any>(this);
  isDisposed = false;
  dispose(): void {
    this.isDisposed = true;
    this.disposed.emit(undefined);
  }
}

describe('the Running sidebar', () => {
  it('lists the open sandbox terminals; open focuses one, shut down closes it', () => {
    const open: FakeTerminal[] = [new FakeTerminal('t1', 's1')];
    const added = new Signal<any, IRunningTerminal>({});
    const activated: string[] = [];
    const manager = new SandboxTerminalsRunning({
      forEach: fn => open.filter(t => !t.isDisposed).forEach(fn),
      widgetAdded: added,
      activate: t => activated.push(t.id),
      icon
    });
    let changes = 0;
    manager.runningChanged.connect(() => changes++);
    const second = new FakeTerminal('t2', 's2');
    open.push(second);
    added.emit(second);
    expect(changes).toBe(1);
    const items = manager.running({ mode: 'list' });
    expect(items.map(i => i.label())).toEqual(['Sandbox s1', 'Sandbox s2']);
    expect(items[1].context).toBe('s2');
    items[1].open!();
    expect(activated).toEqual(['t2']);
    items[0].shutdown!();
    expect(open[0].isDisposed).toBe(true);
    expect(changes).toBe(2);
    expect(manager.running({ mode: 'list' }).map(i => i.label())).toEqual(['Sandbox s2']);
    second.title.label = 'Sandbox s2 [exit 3]';
    second.title.changed.emit(undefined);
    expect(changes).toBe(3);
    manager.shutdownAll();
    expect(manager.running({ mode: 'list' })).toEqual([]);
  });

  it('lists the sessions; a kernel\'s is shut down through its kernel, another destroyed', async () => {
    const status = { ...LOCAL };
    const sessions = [sessionInfo('plain', { created: 2000 }), sessionInfo('kern', { consumer: 'kernel:k-1', created: 1000 })];
    const { settings } = fakeSettings([
      json(status),
      json({ sessions }),
      json([{ id: 'j', path: 'a.ipynb', type: 'notebook', kernel: { id: 'k-1' } }])
    ]);
    const model = new SessionsModel({ client: new SandboxClient(settings) });
    const destroyed: string[] = [];
    const kernels: string[] = [];
    const revealed: string[] = [];
    const manager = new SandboxSessionsRunning({
      model,
      icon,
      reveal: id => revealed.push(id),
      destroy: async id => void destroyed.push(id),
      shutdownKernel: async id => void kernels.push(id),
      now: () => model.state.fetchedAt
    });
    let changes = 0;
    manager.runningChanged.connect(() => changes++);
    await model.refresh();
    expect(changes).toBeGreaterThan(0);
    const items = manager.running({ mode: 'list' });
    expect(items.map(i => i.label())).toEqual(['plain', 'kern (kernel of a.ipynb)']);
    expect(items[1].className).toContain('jp-mod-kernel');
    expect(items[0].detail!()).toBe('1h 00m');
    expect(items[0].labelTitle!()).toContain('consumer: me');
    items[0].open!();
    expect(revealed).toEqual(['plain']);
    await manager.shutdown('kern');
    await manager.shutdown('plain');
    expect(kernels).toEqual(['k-1']);
    expect(destroyed).toEqual(['plain']);
    expect(manager.running({ mode: 'list' })).toEqual([]);
  });

  it('says when a session is about to be reaped', () => {
    const s = sessionInfo('x', { ttl: 10 });
    expect(sessionRow(s, { fetchedAt: 0, kernels: {} }, 20_000).detail).toBe('reaping');
  });
});
