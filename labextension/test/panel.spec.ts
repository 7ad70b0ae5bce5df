/**
 * Issue 48: the panel's session list is one line per session (name or id, provider and time left),
 * its details and Pause / Fork on expand; Pause and Fork only where GET status says the provider
 * can; a magics session shows by its name and notebook. The panel, the model, the client and the
 * commands are the real ones; only fetch answers from a script.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import { SandboxClient } from '../src/api';
import { CommandIDs, addSessionCommands } from '../src/commands';
import { SessionsModel } from '../src/model';
import { agentKeyOf, magicsOf, sessionName } from '../src/names';
import { SandboxPanel } from '../src/panel';
import { sessionRow } from '../src/running';
import { SandboxSessions } from '../src/sessions';
import { IRecorded, LOCAL_STATUS, fakeSettings, json, sessionInfo } from './fakes';

/** What sandboxes.py's status answers on local (sessions can neither pause nor fork). */
const LOCAL = { ...LOCAL_STATUS, max_isolation: 'none', pausable: false, forkable: false };
const VM = { ...LOCAL_STATUS, kind: 'vm', max_isolation: 'vm', pausable: true, forkable: true };

const PLAIN = sessionInfo('sbx-plain', { created: 3000 });
const MAGICS = sessionInfo('sbx-magics', { consumer: 'user:me/magics:train%20set@work%2Fa%20b.ipynb', created: 2000 });
const KERNEL = sessionInfo('sbx-kernel', { consumer: 'kernel:k-1', created: 1000 });
const AGENT = sessionInfo('sbx-agent', { consumer: 'agent:claude', created: 500 });

/** A server that answers status, the sessions and jupyter_server's sessions, every time. */
function server(status: object) {
  const route = (request: IRecorded) => {
    if (request.url.endsWith('/api/sandbox/status')) {
      return json(status);
    }
    if (request.url.endsWith('/api/sandbox/sessions')) {
      return json({ sessions: [PLAIN, MAGICS, KERNEL, AGENT] });
    }
    if (request.url.endsWith('/api/sessions')) {
      return json([{ path: 'nb/k.ipynb', name: 'k.ipynb', type: 'notebook', kernel: { id: 'k-1' } }]);
    }
    return json({ error: 'SandboxRequestError', message: `unexpected ${request.method} ${request.url}` }, 400);
  };
  return fakeSettings(Array.from({ length: 50 }, () => route));
}

const attached: Widget[] = [];
afterEach(() => {
  attached.splice(0).forEach(w => w.dispose());
});

async function panelOn(status: object) {
  const { settings, requests } = server(status);
  const model = new SessionsModel({ client: new SandboxClient(settings) });
  const calls: string[] = [];
  const panel = new SandboxPanel({
    model,
    actions: {
      newSession: () => calls.push('new'),
      openTerminal: id => calls.push(`terminal ${id}`),
      openFiles: id => calls.push(`files ${id}`),
      destroy: id => calls.push(`destroy ${id}`),
      extendTtl: async id => void calls.push(`extend ${id}`),
      extendTtlBy: id => void calls.push(`extend-by ${id}`),
      setPaused: async id => void calls.push(`pause ${id}`),
      fork: async id => void calls.push(`fork ${id}`),
      openDocument: path => calls.push(`open ${path}`)
    }
  });
  Widget.attach(panel, document.body);
  attached.push(panel);
  await model.refresh();
  return { panel, model, calls, requests };
}

const item = (panel: SandboxPanel, id: string) =>
  panel.node.querySelector(`.jp-TaiSandbox-session[data-session-id="${id}"]`) as HTMLElement;

describe('the compact session list', () => {
  it('shows one line per session: its name, provider and time left, details folded', async () => {
    const { panel } = await panelOn(LOCAL);
    const rows = [...panel.node.querySelectorAll('.jp-TaiSandbox-session')] as HTMLElement[];
    expect(rows.map(r => r.dataset.sessionId)).toEqual(['sbx-plain', 'sbx-magics', 'sbx-kernel', 'sbx-agent']);
    const labels = rows.map(r => r.querySelector('.jp-TaiSandbox-sessionLabel')!.textContent);
    expect(labels).toEqual(['sbx-plain', 'train set', 'nb/k.ipynb', 'claude']);
    const sub = item(panel, 'sbx-magics').querySelector('.jp-TaiSandbox-sessionSub') as HTMLElement;
    expect(sub.textContent).toBe('a b.ipynb');
    expect(sub.title).toBe('work/a b.ipynb');
    expect(item(panel, 'sbx-magics').querySelector('.jp-TaiSandbox-magicsBadge')).not.toBeNull();
    expect(item(panel, 'sbx-kernel').querySelector('.jp-TaiSandbox-kernelBadge')).not.toBeNull();
    expect(item(panel, 'sbx-agent').querySelector('.jp-TaiSandbox-agentBadge')).not.toBeNull();
    expect(item(panel, 'sbx-agent').dataset.agent).toBe('claude');
    expect((item(panel, 'sbx-agent').querySelector('.jp-TaiSandbox-sessionRow') as HTMLElement).title).toMatch(
      /^Coding agent: claude \(sbx-agent\)\n/
    );
    expect(item(panel, 'sbx-plain').querySelector('.jp-TaiSandbox-agentBadge')).toBeNull();
    for (const row of rows) {
      expect(row.querySelector('.jp-TaiSandbox-sessionMeta')!.textContent).toMatch(/^local · (59m|1h)/);
      expect((row.querySelector('.jp-TaiSandbox-sessionBody') as HTMLElement).hidden).toBe(true);
      expect(row.querySelector('.jp-TaiSandbox-sessionRow')!.getAttribute('aria-expanded')).toBe('false');
    }
  });

  it('opens a row on click or Enter, and keeps it open across refreshes', async () => {
    const { panel, model } = await panelOn(LOCAL);
    const li = item(panel, 'sbx-plain');
    const row = li.querySelector('.jp-TaiSandbox-sessionRow') as HTMLElement;
    row.click();
    const body = li.querySelector('.jp-TaiSandbox-sessionBody') as HTMLElement;
    expect(body.hidden).toBe(false);
    expect(body.textContent).toContain('sbx-plain');
    expect(body.querySelector('.jp-TaiSandbox-timeLeft')!.textContent).toMatch(/^reaped in/);
    await model.refresh();
    expect(body.hidden).toBe(false);
    row.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true }));
    expect(body.hidden).toBe(true);
  });

  it("names a magics session's name and notebook among its details", async () => {
    const { panel } = await panelOn(LOCAL);
    const field = (name: string) =>
      item(panel, 'sbx-magics').querySelector(`.jp-TaiSandbox-field[data-field="${name}"]`)!.textContent;
    expect(field('%sandbox name')).toBe('%sandbox name: train set');
    expect(field('notebook')).toBe('notebook: work/a b.ipynb');
    expect(field('consumer')).toBe('consumer: user:me/magics:…');
    expect(item(panel, 'sbx-plain').querySelector('.jp-TaiSandbox-field[data-field="notebook"]')).toBeNull();
  });

  it("runs a row's Terminal, Files and Destroy without folding or unfolding it", async () => {
    const { panel, calls } = await panelOn(LOCAL);
    const li = item(panel, 'sbx-magics');
    for (const cls of ['openTerminal', 'openFiles', 'destroy']) {
      (li.querySelector(`.jp-TaiSandbox-sessionRow .jp-TaiSandbox-${cls}`) as HTMLElement).click();
    }
    expect(calls).toEqual(['terminal sbx-magics', 'files sbx-magics', 'destroy sbx-magics']);
    expect((li.querySelector('.jp-TaiSandbox-sessionBody') as HTMLElement).hidden).toBe(true);
  });
});

describe('Pause and Fork follow what GET status says the provider can', () => {
  it('are not offered on local (pausable and forkable false)', async () => {
    const { panel } = await panelOn(LOCAL);
    for (const li of panel.node.querySelectorAll('.jp-TaiSandbox-session')) {
      expect((li.querySelector('.jp-TaiSandbox-pause') as HTMLElement).hidden).toBe(true);
      expect((li.querySelector('.jp-TaiSandbox-fork') as HTMLElement).hidden).toBe(true);
    }
  });

  it('are offered on a provider that can', async () => {
    const { panel } = await panelOn(VM);
    const li = item(panel, 'sbx-plain');
    expect((li.querySelector('.jp-TaiSandbox-pause') as HTMLElement).hidden).toBe(false);
    expect((li.querySelector('.jp-TaiSandbox-fork') as HTMLElement).hidden).toBe(false);
  });

  it('leave the palette on local, and a run of either posts nothing but says why', async () => {
    for (const [status, can] of [
      [LOCAL, false],
      [VM, true]
    ] as const) {
      const { settings, requests } = server(status);
      const sessions = new SandboxSessions({ client: new SandboxClient(settings), showPanel: () => undefined });
      const commands = new CommandRegistry();
      addSessionCommands(commands, sessions, null);
      await sessions.model.refresh();
      for (const id of [CommandIDs.pause, CommandIDs.resume, CommandIDs.fork]) {
        expect(commands.isEnabled(id)).toBe(can);
        expect(commands.isVisible(id)).toBe(can);
      }
      if (!can) {
        const errors: string[] = [];
        sessions.notifyError = (message: string) => void errors.push(message);
        expect(await commands.execute(CommandIDs.pause, { id: 'sbx-plain' })).toBe(false);
        expect(await commands.execute(CommandIDs.fork, { id: 'sbx-plain' })).toBe(null);
        expect(requests.filter(r => r.method === 'POST')).toEqual([]);
        expect(errors[0]).toBe(
          'Cannot pause: the local provider cannot pause sessions (GET /api/sandbox/status: pausable false).'
        );
      }
      sessions.model.dispose();
    }
  });
});

describe("a coding agent's session", () => {
  it('is read from its consumer label agent:<key>', () => {
    expect(agentKeyOf('agent:claude')).toBe('claude');
    expect(agentKeyOf('agent:')).toBeNull();
    expect(agentKeyOf('agent:a/b')).toBeNull();
    expect(agentKeyOf('kernel:1')).toBeNull();
    expect(agentKeyOf('user:agent:x')).toBeNull();
    expect(agentKeyOf(null)).toBeNull();
  });

  it('shows as the coding agent in the panel, the picker and the Running sidebar', () => {
    expect(sessionName(AGENT, {})).toEqual({ label: 'Coding agent: claude', sub: '', origin: 'agent' });
    expect(sessionRow(AGENT, { fetchedAt: 0, kernels: {} }, 0).label).toBe('Coding agent: claude (sbx-agent)');
  });
});

describe("a magics session's name", () => {
  it('is read from its consumer label, percent-decoded', () => {
    expect(magicsOf('user:me/magics:default')).toEqual({ name: 'default', notebook: null });
    expect(magicsOf('user:a%2Fb/magics:x%40y@dir%2Fn.ipynb')).toEqual({ name: 'x@y', notebook: 'dir/n.ipynb' });
    expect(magicsOf('user:me')).toBeNull();
    expect(magicsOf('kernel:1')).toBeNull();
    expect(magicsOf('user:me/magics:')).toBeNull();
  });

  it("names the Running sidebar's row too", () => {
    const state = { fetchedAt: 0, kernels: {} };
    expect(sessionRow(MAGICS, state, 0).label).toBe('train set (%sandbox in work/a b.ipynb)');
    expect(sessionName(PLAIN, {}).label).toBe('sbx-plain');
    // jupyter_server tells a kernel its notebook's absolute path: shown under the server's root
    const absolute = { ...MAGICS, consumer: 'user:me/magics:t@%2Fhome%2Fme%2Fwork%2Fa.ipynb' };
    expect(sessionName(absolute, {}, '/home/me').sub).toBe('work/a.ipynb');
    expect(sessionName(absolute, {}, '/home/me/').sub).toBe('work/a.ipynb');
    expect(sessionName(absolute, {}, '/srv').sub).toBe('/home/me/work/a.ipynb');
  });
});
