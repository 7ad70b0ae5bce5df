/**
 * Issue 52: a session's egress policy in the panel: its details (allow-list or "any host", deny-list,
 * secrets by name and variable, never a placeholder or value), the "Egress policy…" button where the
 * provider has an egress gateway, the dialog's lists as PATCH sends them, the create dialog's allow-list,
 * the recent decisions. The panel, the model and the client are the real ones; only fetch answers from a
 * script.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { Widget } from '@lumino/widgets';

import { ISessionInfo, SandboxClient } from '../src/api';
import { NewSessionBody } from '../src/dialogs';
import {
  EgressPolicyBody,
  auditLineText,
  egressFields,
  egressForm,
  egressOf,
  egressRequest,
  parseEntries
} from '../src/egress';
import { SessionsModel } from '../src/model';
import { SandboxPanel } from '../src/panel';
import { SpecFormError, buildSpec, defaultForm } from '../src/spec';
import { IRecorded, LOCAL_STATUS, fakeSettings, json, sessionInfo } from './fakes';

const DOCKER = { ...LOCAL_STATUS, kind: 'docker', max_isolation: 'container', egress_policy: true };
const LOCAL = { ...LOCAL_STATUS, max_isolation: 'none', egress_policy: false };

const PLACEHOLDER = 'tai-placeholder-0123456789abcdef0123456789abcdef';

function docker(id: string, egress: unknown, created = 3000): ISessionInfo {
  return { ...sessionInfo(id, { created }), kind: 'docker', isolation: 'container', spec: egress ? { egress } : {} };
}

const POLICY = docker('sbx-policy', {
  allow: ['pypi.org', '*.github.com'],
  deny: ['gist.github.com'],
  secrets: [
    { name: 'github-token', env: 'GH_TOKEN', placeholder: PLACEHOLDER, hosts: ['api.github.com'], query: false, body: false }
  ]
});
const ANY = docker('sbx-any', { allow: null, deny: [], secrets: [] }, 2000);
const PLAIN = docker('sbx-plain', null, 1000);

function server(status: object, sessions: ISessionInfo[]) {
  const route = (request: IRecorded) => {
    if (request.url.endsWith('/api/sandbox/status')) {
      return json(status);
    }
    if (request.url.endsWith('/api/sandbox/sessions')) {
      return json({ sessions });
    }
    return json({ error: 'SandboxRequestError', message: `unexpected ${request.method} ${request.url}` }, 400);
  };
  return fakeSettings(Array.from({ length: 20 }, () => route));
}

const attached: Widget[] = [];
afterEach(() => {
  attached.splice(0).forEach(w => w.dispose());
});

async function panelOn(status: object, sessions: ISessionInfo[]) {
  const { settings } = server(status, sessions);
  const model = new SessionsModel({ client: new SandboxClient(settings) });
  const calls: string[] = [];
  const panel = new SandboxPanel({
    model,
    actions: {
      newSession: () => calls.push('new'),
      openTerminal: () => undefined,
      openFiles: () => undefined,
      destroy: () => undefined,
      extendTtl: async () => undefined,
      extendTtlBy: () => undefined,
      setPaused: async () => undefined,
      fork: async () => undefined,
      openDocument: () => undefined,
      editEgress: id => void calls.push(`egress ${id}`)
    }
  });
  Widget.attach(panel, document.body);
  attached.push(panel);
  await model.refresh();
  return { panel, calls };
}

const item = (panel: SandboxPanel, id: string) =>
  panel.node.querySelector(`.jp-TaiSandbox-session[data-session-id="${id}"]`) as HTMLElement;
const field = (li: HTMLElement, name: string) =>
  li.querySelector(`.jp-TaiSandbox-field[data-field="${name}"]`)?.textContent ?? null;

describe("a session's egress policy among its details", () => {
  it('shows the allow-list, the deny-list and the secrets by variable and name, never the placeholder', async () => {
    const { panel, calls } = await panelOn(DOCKER, [POLICY, ANY, PLAIN]);
    const li = item(panel, 'sbx-policy');
    expect(field(li, 'egress allow')).toBe('egress allow: pypi.org, *.github.com');
    expect(field(li, 'egress deny')).toBe('egress deny: gist.github.com');
    expect(field(li, 'secrets')).toBe('secrets: GH_TOKEN (github-token)');
    expect(li.textContent).not.toContain(PLACEHOLDER);
    expect(li.innerHTML).not.toContain(PLACEHOLDER);
    const egress = li.querySelector('.jp-TaiSandbox-egress') as HTMLButtonElement;
    expect(egress.hidden).toBe(false);
    egress.click();
    expect(calls).toEqual(['egress sbx-policy']);
  });

  it('says "any host" for a null allow-list, and "no policy" for a plain egress session (no button)', async () => {
    const { panel } = await panelOn(DOCKER, [POLICY, ANY, PLAIN]);
    expect(field(item(panel, 'sbx-any'), 'egress allow')).toBe('egress allow: any host');
    expect(field(item(panel, 'sbx-any'), 'egress deny')).toBe('egress deny: —');
    expect(field(item(panel, 'sbx-any'), 'secrets')).toBeNull();
    expect((item(panel, 'sbx-any').querySelector('.jp-TaiSandbox-egress') as HTMLElement).hidden).toBe(false);
    expect(field(item(panel, 'sbx-plain'), 'egress')).toBe('egress: any host (no policy)');
    expect((item(panel, 'sbx-plain').querySelector('.jp-TaiSandbox-egress') as HTMLElement).hidden).toBe(true);
  });

  it('adds nothing where the provider has no egress gateway (local)', async () => {
    const local = { ...sessionInfo('sbx-local'), spec: {} };
    const { panel } = await panelOn(LOCAL, [local]);
    const li = item(panel, 'sbx-local');
    expect(li.querySelector('[data-field^="egress"]')).toBeNull();
    expect((li.querySelector('.jp-TaiSandbox-egress') as HTMLElement).hidden).toBe(true);
  });
});

describe('the egress dialog and its request', () => {
  it('fills the lists one entry a line and sends them back as typed, any host as null', () => {
    const form = egressForm(egressOf(POLICY));
    expect(form).toEqual({ anyHost: false, allow: 'pypi.org\n*.github.com', deny: 'gist.github.com' });
    expect(egressRequest({ ...form, allow: 'pypi.org\n\n  example.com:5432 , x.org\n' })).toEqual({
      allow: ['pypi.org', 'example.com:5432', 'x.org'],
      deny: ['gist.github.com']
    });
    expect(egressRequest({ anyHost: true, allow: 'ignored.org', deny: '' })).toEqual({ allow: null, deny: [] });
    expect(egressForm(egressOf(ANY)).anyHost).toBe(true);
    expect(parseEntries(' \n ')).toEqual([]);
  });

  it("keeps what was typed and shows the server's refusal; the recent decisions newest first", async () => {
    const body = new EgressPolicyBody({
      session: POLICY,
      initial: { anyHost: false, allow: 'evil.example', deny: '' },
      error: "The server refused the change: allow entry 'evil.example' is not within the operator's rule",
      audit: async () => [
        { time: '2026-12-05T10:00:01.5Z', kind: 'dns', host: 'pypi.org', port: 53, decision: 'allow', reason: 'allowed' },
        { time: '2026-12-05T10:00:02Z', kind: 'tls', host: 'evil.example', port: 443, decision: 'refuse', reason: 'not allowed' }
      ]
    });
    Widget.attach(body, document.body);
    attached.push(body);
    const error = body.node.querySelector('.jp-TaiSandbox-egressError') as HTMLElement;
    expect(error.hidden).toBe(false);
    expect(error.textContent).toContain("'evil.example' is not within the operator's rule");
    expect(body.getValue()).toEqual({ anyHost: false, allow: 'evil.example', deny: '' });
    expect(body.node.querySelector('[data-secret="github-token"]')!.textContent).toBe(
      'GH_TOKEN (github-token) → api.github.com'
    );
    expect(body.node.textContent).not.toContain(PLACEHOLDER);
    const any = body.node.querySelector('input[name="anyHost"]') as HTMLInputElement;
    any.click();
    expect((body.node.querySelector('textarea[name="allow"]') as HTMLTextAreaElement).disabled).toBe(true);
    expect(body.getValue().anyHost).toBe(true);
    await new Promise(resolve => setTimeout(resolve, 0));
    const lines = body.node.querySelector('.jp-TaiSandbox-egressAuditLines')!.textContent!.split('\n');
    expect(lines).toEqual(['10:00:02 refuse tls evil.example:443: not allowed', '10:00:01 allow dns pypi.org:53: allowed']);
  });

  it('words a dropped-lines record and a substitution', () => {
    expect(auditLineText({ time: '2026-12-05T10:00:00Z', kind: 'audit-dropped', count: 7 })).toBe(
      "10:00:00 7 decisions dropped (the gateway's audit was full)"
    );
    expect(
      auditLineText({ kind: 'substitution', host: 'api.github.com', port: 443, decision: 'allow', secret: 'github-token' })
    ).toBe('allow substitution api.github.com:443 secret github-token');
  });

  it('PATCHes {egress: {allow, deny}} and reads the audit of the session, 50 lines', async () => {
    const { settings, requests } = fakeSettings([json(POLICY), json({ lines: [] })]);
    const client = new SandboxClient(settings);
    const updated = await client.setEgress('sbx-policy', { allow: ['pypi.org'], deny: [] });
    expect(updated.id).toBe('sbx-policy');
    expect(requests[0].method).toBe('PATCH');
    expect(requests[0].url).toBe('http://lab.test/base/api/sandbox/sessions/sbx-policy');
    expect(JSON.parse(requests[0].body!)).toEqual({ egress: { allow: ['pypi.org'], deny: [] } });
    expect(await client.egressAudit('sbx-policy')).toEqual([]);
    expect(requests[1].url).toBe('http://lab.test/base/api/sandbox/egress/audit?session=sbx-policy&limit=50');
  });
});

describe("the New session dialog's allow-list", () => {
  const form = defaultForm({ image: '', ttlSeconds: 3600, network: 'egress' });

  it('becomes the spec\'s egress.allow; empty is no policy', () => {
    expect(buildSpec({ ...form, egressAllow: 'pypi.org\n*.github.com' }).egress).toEqual({
      allow: ['pypi.org', '*.github.com']
    });
    expect(buildSpec(form)).not.toHaveProperty('egress');
    expect(() => buildSpec({ ...form, network: 'none', egressAllow: 'pypi.org' })).toThrow(SpecFormError);
  });

  it('shows only where the provider has an egress gateway, and only on network egress', () => {
    const onLocal = new NewSessionBody(form, LOCAL as any);
    expect(onLocal.node.querySelector('textarea[name="egressAllow"]')).toBeNull();
    const onDocker = new NewSessionBody(form, { ...DOCKER, networks: ['egress', 'internal', 'none'] } as any);
    const area = onDocker.node.querySelector('textarea[name="egressAllow"]') as HTMLTextAreaElement;
    area.value = 'pypi.org';
    expect(onDocker.getValue().egressAllow).toBe('pypi.org');
    const network = onDocker.node.querySelector('select[name="network"]') as HTMLSelectElement;
    network.value = 'none';
    network.dispatchEvent(new Event('change'));
    expect((area.closest('label') as HTMLElement).hidden).toBe(true);
    expect(onDocker.getValue().egressAllow).toBe('');
    onLocal.dispose();
    onDocker.dispose();
  });
});
