/**
 * A session's egress policy in the panel (issue 52): its lines among the session's details (the hosts it
 * may reach, "any host" when its allow-list is null, those it may not, the operator's secrets by name and
 * variable, never a value), and the "Egress policy…" dialog: the allow and deny lists, one entry a line,
 * sent with PATCH; a refusal (over the operator's rule, a provider that cannot) opens the dialog again
 * with the server's message and what was typed; under it, the session's recent egress decisions.
 */
import { Dialog, ICommandPalette, Notification, showDialog } from '@jupyterlab/apputils';
import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import { CommandIDs, PALETTE_CATEGORY, addOnSessionCommand } from './commands';
import { IEgressAuditLine, IEgressPolicy, IEgressRequest, ISecretGrant, ISessionInfo, IStatus } from './api';
import { describeError } from './model';
import { SandboxAPIError } from './request';
import { parseEntries } from './spec';
import { ISandboxSessions } from './tokens';

/** How many of the session's newest egress decisions the dialog shows. */
export const AUDIT_LINES = 50;

export { parseEntries };

function strings(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : [];
}

/** The session's egress policy in force (`spec.egress`), or null when it has none (plain egress). */
export function egressOf(session: ISessionInfo): IEgressPolicy | null {
  const raw = (session.spec ?? {})['egress'];
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) {
    return null;
  }
  const fields = raw as { allow?: unknown; deny?: unknown; secrets?: unknown };
  const secrets: ISecretGrant[] = Array.isArray(fields.secrets)
    ? fields.secrets
        .filter((g): g is Record<string, unknown> => !!g && typeof g === 'object')
        .map(g => ({
          name: typeof g.name === 'string' ? g.name : '?',
          env: typeof g.env === 'string' ? g.env : '?',
          hosts: strings(g.hosts)
        }))
    : [];
  return {
    allow: Array.isArray(fields.allow) ? strings(fields.allow) : null,
    deny: strings(fields.deny),
    secrets
  };
}

/** `GH_TOKEN (github-token)`: a secret as a session sees it, by its variable and the operator's name. */
export function secretText(grant: ISecretGrant): string {
  return grant.env === grant.name ? grant.env : `${grant.env} (${grant.name})`;
}

/**
 * The egress lines of a session's details, [label, text, tooltip]: the allow-list ("any host" when null),
 * the deny-list and the secrets of a session with a policy; "any host (no policy)" for a plain egress
 * session where the provider could enforce one; nothing where it cannot (local) or without egress.
 */
export function egressFields(session: ISessionInfo, status: IStatus | null): [string, string, string][] {
  const policy = egressOf(session);
  if (!policy) {
    return session.network === 'egress' && status?.egress_policy
      ? [['egress', 'any host (no policy)', 'Created without an egress policy: it reaches any host, directly']]
      : [];
  }
  const fields: [string, string, string][] = [
    [
      'egress allow',
      policy.allow === null ? 'any host' : policy.allow.length ? policy.allow.join(', ') : 'no host',
      policy.allow === null
        ? 'Any host name on ports 80 and 443, through its egress gateway (less the deny-list)'
        : 'The host names it may reach, through its egress gateway'
    ],
    ['egress deny', policy.deny.length ? policy.deny.join(', ') : '—', 'The host names it may not reach']
  ];
  if (policy.secrets.length) {
    fields.push([
      'secrets',
      policy.secrets.map(secretText).join(', '),
      policy.secrets
        .map(g => `${g.env}: a placeholder for the operator's secret ${g.name}, sent only to ${g.hosts.join(', ')}`)
        .join('\n')
    ]);
  }
  return fields;
}

/** Why the provider cannot change a session's egress (its status says egress_policy false), or null. */
export function egressUnable(status: IStatus | null): string | null {
  if (!status || status.kind === 'off' || status.egress_policy !== false) {
    return null;
  }
  return `the ${status.kind} provider has no egress gateway: it cannot enforce an egress policy (GET /api/sandbox/status: egress_policy false).`;
}

/** "Egress policy…" on a session's details: for a session with a policy, where the provider can. */
export function canEditEgress(session: ISessionInfo, status: IStatus | null): boolean {
  return session.network === 'egress' && egressOf(session) !== null && !egressUnable(status);
}

/** The dialog's values, as typed. */
export interface IEgressForm {
  /** No allow-list: any host on ports 80 and 443 (or the operator's rule's list). */
  anyHost: boolean;
  allow: string;
  deny: string;
}

export function egressForm(policy: IEgressPolicy | null): IEgressForm {
  return {
    anyHost: !policy || policy.allow === null,
    allow: (policy?.allow ?? []).join('\n'),
    deny: (policy?.deny ?? []).join('\n')
  };
}

/** The PATCH body's `egress` of a form. */
export function egressRequest(form: IEgressForm): IEgressRequest {
  return { allow: form.anyHost ? null : parseEntries(form.allow), deny: parseEntries(form.deny) };
}

/** `12:01:02 refuse dns evil.example: not allowed`: one audit line, short. */
export function auditLineText(line: IEgressAuditLine): string {
  if (line.kind === 'audit-dropped') {
    return `${timeOf(line.time)} ${line.count ?? '?'} decisions dropped (the gateway's audit was full)`;
  }
  const where = line.host ? `${line.host}${line.port ? `:${line.port}` : ''}` : '';
  const secret = line.secret ? ` secret ${line.secret}` : '';
  const reason = line.reason ? `: ${line.reason}` : '';
  return `${timeOf(line.time)} ${line.decision ?? ''} ${line.kind ?? ''} ${where}${secret}${reason}`
    .replace(/\s+/g, ' ')
    .trim();
}

function timeOf(time: string | undefined): string {
  const match = /T(\d\d:\d\d:\d\d)/.exec(time ?? '');
  return match ? match[1] : (time ?? '');
}

/** The dialog's body: the lists, the secrets (read only), the last refusal, the recent decisions. */
export class EgressPolicyBody extends Widget implements Dialog.IBodyWidget<IEgressForm> {
  constructor(options: {
    session: ISessionInfo;
    initial: IEgressForm;
    /** the server's message on the last try, shown above the lists */
    error?: string | null;
    /** the session's recent egress decisions (oldest first), or null to leave them out */
    audit?: () => Promise<IEgressAuditLine[]>;
  }) {
    super();
    this.addClass('jp-TaiSandbox-newSession');
    this.addClass('jp-TaiSandbox-egressPolicy');
    const { initial, error } = options;
    const policy = egressOf(options.session);

    const intro = document.createElement('p');
    intro.className = 'jp-TaiSandbox-egressIntro';
    intro.textContent =
      "One host name a line: example.com, *.example.com (any name under it), NAME:PORT (raw TCP). Each allowed entry must be within the operator's rule; its deny entries are always added. New connections follow within a second.";
    this.node.appendChild(intro);

    this._error = document.createElement('p');
    this._error.className = 'jp-TaiSandbox-formWarning jp-TaiSandbox-egressError';
    this._error.setAttribute('role', 'alert');
    this._error.hidden = !error;
    this._error.textContent = error ?? '';
    this.node.appendChild(this._error);

    this._anyHost = document.createElement('input');
    this._anyHost.type = 'checkbox';
    this._anyHost.checked = initial.anyHost;
    this._anyHost.title = "No allow-list: any host name on ports 80 and 443 (or the operator's rule's list)";
    this._row('anyHost', 'Any host', this._anyHost, 'no allow-list (the deny-list still holds)');

    this._allow = this._textarea('allow', 'Allow', initial.allow, 'pypi.org\nfiles.pythonhosted.org\n*.github.com');
    this._deny = this._textarea('deny', 'Deny', initial.deny, 'gist.github.com');
    const sync = () => {
      this._allow.disabled = this._anyHost.checked;
    };
    this._anyHost.addEventListener('change', sync);
    sync();

    if (policy?.secrets.length) {
      const secrets = document.createElement('div');
      secrets.className = 'jp-TaiSandbox-formRow jp-TaiSandbox-egressSecrets';
      const label = document.createElement('span');
      label.textContent = 'Secrets';
      const list = document.createElement('ul');
      for (const grant of policy.secrets) {
        const li = document.createElement('li');
        li.dataset.secret = grant.name;
        li.textContent = `${secretText(grant)} → ${grant.hosts.join(', ')}`;
        list.appendChild(li);
      }
      const hint = document.createElement('span');
      hint.className = 'jp-TaiSandbox-formHint';
      hint.textContent = "the operator's: a placeholder in the session, the real value sent only to those hosts";
      secrets.append(label, list, hint);
      this.node.appendChild(secrets);
    }

    if (options.audit) {
      const recent = document.createElement('details');
      recent.className = 'jp-TaiSandbox-egressAudit';
      const summary = document.createElement('summary');
      summary.textContent = 'Recent egress decisions';
      const lines = document.createElement('pre');
      lines.className = 'jp-TaiSandbox-egressAuditLines';
      lines.textContent = 'loading…';
      recent.append(summary, lines);
      this.node.appendChild(recent);
      options.audit().then(
        found => {
          recent.dataset.lines = String(found.length);
          lines.textContent = found.length
            ? found
                .slice(-AUDIT_LINES)
                .reverse()
                .map(auditLineText)
                .join('\n')
            : 'none yet';
        },
        reason => {
          recent.dataset.lines = 'error';
          lines.textContent = `cannot read them: ${describeError(reason)}`;
        }
      );
    }
  }

  getValue(): IEgressForm {
    return { anyHost: this._anyHost.checked, allow: this._allow.value, deny: this._deny.value };
  }

  private _row(name: string, label: string, field: HTMLElement, hint?: string): void {
    const row = document.createElement('label');
    row.className = 'jp-TaiSandbox-formRow';
    const text = document.createElement('span');
    text.textContent = label;
    field.setAttribute('name', name);
    row.append(text, field);
    if (hint) {
      const small = document.createElement('span');
      small.className = 'jp-TaiSandbox-formHint';
      small.dataset.field = name;
      small.textContent = hint;
      row.append(small);
    }
    this.node.appendChild(row);
  }

  private _textarea(name: string, label: string, value: string, placeholder: string): HTMLTextAreaElement {
    const area = document.createElement('textarea');
    area.className = 'jp-mod-styled jp-TaiSandbox-egressList';
    area.rows = 5;
    area.value = value;
    area.placeholder = placeholder;
    area.spellcheck = false;
    this._row(name, label, area);
    return area;
  }

  private _error: HTMLElement;
  private _anyHost: HTMLInputElement;
  private _allow: HTMLTextAreaElement;
  private _deny: HTMLTextAreaElement;
}

/**
 * The "Egress policy…" action: the session's policy fresh from the server in the dialog; Save sends it
 * with PATCH. A refusal opens the dialog again with the server's message and what was typed; a session
 * gone says so. True once the server took the change.
 */
export async function editEgress(sessions: ISandboxSessions, id: string): Promise<boolean> {
  const info = await sessions.fetchSession(id, "change the session's egress policy");
  if (!info) {
    return false;
  }
  let form = egressForm(egressOf(info));
  let error: string | null = null;
  for (;;) {
    const body = new EgressPolicyBody({
      session: info,
      initial: form,
      error,
      audit: () => sessions.client.egressAudit(id, AUDIT_LINES)
    });
    const result = await showDialog({
      title: `Egress policy of ${id}`,
      body,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Save' })],
      focusNodeSelector: 'textarea'
    });
    if (!result.button.accept || !result.value) {
      return false;
    }
    form = result.value;
    try {
      const updated = await sessions.client.setEgress(id, egressRequest(form));
      sessions.clearError();
      sessions.model.updateLocally(updated);
      const policy = egressOf(updated);
      Notification.success(
        `Egress policy of ${id} changed: ${
          !policy || policy.allow === null ? 'any host' : `${policy.allow.length} allowed`
        }, ${policy?.deny.length ?? 0} denied (new connections within a second).`,
        { autoClose: 3000 }
      );
      void sessions.model.refreshSoon();
      return true;
    } catch (reason) {
      if (reason instanceof SandboxAPIError && reason.status === 404) {
        sessions.notifyError(`Cannot change the egress policy: session ${id} is gone (destroyed or reaped).`);
        sessions.model.removeLocally(id);
        return false;
      }
      error = `The server refused the change: ${describeError(reason)}`;
    }
  }
}

/** "Egress Policy of a Sandbox Session…": the dialog above on `args.id` or a session the user picks. */
export function addEgressCommands(
  commands: CommandRegistry,
  sessions: ISandboxSessions,
  palette: ICommandPalette | null
): void {
  addOnSessionCommand(commands, sessions, CommandIDs.egressPolicy, {
    label: 'Egress Policy of a Sandbox Session…',
    caption: 'See and change the host names a sandbox session may reach (within the operator\'s rule)',
    verb: "change the egress policy of",
    none: false,
    run: id => editEgress(sessions, id),
    unable: () => egressUnable(sessions.model.state.status)
  });
  palette?.addItem({ command: CommandIDs.egressPolicy, category: PALETTE_CATEGORY });
}
