/**
 * What a session is called where a person looks for it: a magics session by its name (and the
 * notebook whose `%sandbox` made it), a sandboxed kernel's by the notebook it serves, a coding
 * agent's (a sandboxed ACP persona of the chat) by its key, any other by its id. All read the
 * session's consumer label; nothing here touches the DOM or the network.
 */
import { PageConfig } from '@jupyterlab/coreutils';

import { IKernelUser, kernelIdOf } from './kernels';

/**
 * A notebook path as the file browser names it: under the server's root (`serverRoot`, the
 * page's), relative to it; jupyter_server tells a kernel its notebook's absolute path.
 */
export function relativeNotebook(path: string, root: string = PageConfig.getOption('serverRoot')): string {
  const base = root.replace(/\/+$/, '');
  return base && path.startsWith(`${base}/`) ? path.slice(base.length + 1) : path;
}

/**
 * The sub-label the magics put under the caller's own label (jupyter_tai_sandbox/magics):
 * `user:NAME/magics:<name>` or `user:NAME/magics:<name>@<notebook path>`, both parts
 * percent-encoded.
 */
export const MAGICS_LABEL = 'magics:';

/** A magics session's name and notebook, or null for any other consumer. */
export function magicsOf(consumer: string | null | undefined): { name: string; notebook: string | null } | null {
  if (!consumer) {
    return null;
  }
  const at = consumer.lastIndexOf(`/${MAGICS_LABEL}`);
  if (at < 0) {
    return null;
  }
  const rest = consumer.slice(at + 1 + MAGICS_LABEL.length);
  if (!rest || rest.includes('/')) {
    return null;
  }
  const [name, notebook] = rest.split('@', 2);
  const decode = (part: string) => {
    try {
      return decodeURIComponent(part);
    } catch {
      return part;
    }
  };
  return name ? { name: decode(name), notebook: notebook ? decode(notebook) : null } : null;
}

/**
 * The consumer label of a coding agent's session (jupyter_tai_sandbox/agents, labels.agent_label):
 * `agent:<key>`, the key of the persona in the operator's SandboxAgents.personas.
 */
export const AGENT_CONSUMER_PREFIX = 'agent:';

/** The persona key of a coding agent's session, or null for any other consumer. */
export function agentKeyOf(consumer: string | null | undefined): string | null {
  if (!consumer || !consumer.startsWith(AGENT_CONSUMER_PREFIX)) {
    return null;
  }
  const key = consumer.slice(AGENT_CONSUMER_PREFIX.length).trim();
  return key && !key.includes('/') ? key : null;
}

/** The words a coding agent's session shows by: `Coding agent: <key>`. */
export function agentLabel(key: string): string {
  return `Coding agent: ${key}`;
}

export interface ISessionName {
  /** The row's words: the magics name, the kernel's notebook(s), the coding agent, or the session id. */
  label: string;
  /** Beside it, quieter: the magics session's notebook, under the server's root ('' when none). */
  sub: string;
  origin: 'magics' | 'kernel' | 'agent' | null;
}

/** The name a session shows by; `kernels` maps kernel id -> what it serves (GET /api/sessions). */
export function sessionName(
  session: { id: string; consumer: string },
  kernels: Record<string, IKernelUser[]>,
  root?: string
): ISessionName {
  const magics = magicsOf(session.consumer);
  if (magics) {
    return { label: magics.name, sub: magics.notebook ? relativeNotebook(magics.notebook, root) : '', origin: 'magics' };
  }
  const kernelId = kernelIdOf(session.consumer);
  if (kernelId) {
    const users = kernels[kernelId] ?? [];
    return { label: users.length ? users.map(u => u.path).join(', ') : session.id, sub: '', origin: 'kernel' };
  }
  const agent = agentKeyOf(session.consumer);
  if (agent) {
    return { label: agentLabel(agent), sub: '', origin: 'agent' };
  }
  return { label: session.id, sub: '', origin: null };
}
