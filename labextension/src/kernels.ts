/**
 * Pure helpers for what the panel shows beside a session: the notebook a
 * sandboxed kernel serves (consumer `kernel:<kernel id>`, looked up in
 * jupyter_server's GET /api/sessions), the "+30 min" TTL, and resource use.
 * Nothing here touches the DOM or the network.
 */

/** The consumer label a sandboxed kernel's session carries (kernel_provisioner.py). */
export const KERNEL_CONSUMER_PREFIX = 'kernel:';

/** Seconds the "+30 min" action adds to a session's TTL. */
export const EXTEND_SECONDS = 1800;

/** The kernel id of a kernel's session, or null for any other consumer. */
export function kernelIdOf(consumer: string | null | undefined): string | null {
  if (!consumer || !consumer.startsWith(KERNEL_CONSUMER_PREFIX)) {
    return null;
  }
  const id = consumer.slice(KERNEL_CONSUMER_PREFIX.length).trim();
  return id || null;
}

/** What a kernel serves: a notebook (or a console, a file) of jupyter_server's sessions. */
export interface IKernelUser {
  /** The document's path, relative to the server's root. */
  path: string;
  name: string;
  /** `notebook`, `console`, `file`… */
  type: string;
}

/** One row of jupyter_server's GET /api/sessions (only the fields used here). */
export interface IJupyterSession {
  id?: string;
  path?: string;
  name?: string;
  type?: string;
  kernel?: { id?: string; name?: string } | null;
  notebook?: { path?: string; name?: string } | null;
}

/** kernel id -> what uses it, from GET /api/sessions (rows without a kernel are skipped). */
export function usersByKernel(rows: unknown): Record<string, IKernelUser[]> {
  const found: Record<string, IKernelUser[]> = {};
  if (!Array.isArray(rows)) {
    return found;
  }
  for (const row of rows as IJupyterSession[]) {
    const kernelId = row?.kernel?.id;
    if (typeof kernelId !== 'string' || !kernelId) {
      continue;
    }
    const path = row.path ?? row.notebook?.path ?? '';
    const name = row.name || row.notebook?.name || path.split('/').pop() || path;
    (found[kernelId] ??= []).push({ path, name, type: row.type || 'notebook' });
  }
  for (const users of Object.values(found)) {
    users.sort((a, b) => a.path.localeCompare(b.path));
  }
  return found;
}

/** The text beside a kernel badge: the notebook(s) it serves, or that none is known. */
export function kernelServesText(users: IKernelUser[] | undefined): string {
  if (!users || users.length === 0) {
    return 'no notebook (yet)';
  }
  return users.map(u => (u.type === 'notebook' ? u.path : `${u.path} (${u.type})`)).join(', ');
}

/** The session's TTL now (counted from its creation, as the server counts it). */
export function currentTtl(session: { created_at: number; expires_at: number }): number {
  return Math.max(0, session.expires_at - session.created_at);
}

/** The TTL to ask for: the current one plus `add` seconds, whole seconds. */
export function extendedTtl(
  session: { created_at: number; expires_at: number },
  add: number = EXTEND_SECONDS
): number {
  return Math.ceil(currentTtl(session) + add);
}

/**
 * Why "+30 min" cannot succeed for this session (the TTL it would ask for is over
 * the operator's maximum, SandboxPolicy.max_ttl_seconds), or null when it can;
 * `maxTtl` 0 or absent: no maximum.
 */
export function extendBlockedReason(
  session: { created_at: number; expires_at: number },
  maxTtl: number | null | undefined,
  add: number = EXTEND_SECONDS
): string | null {
  if (!maxTtl || maxTtl <= 0) {
    return null;
  }
  const wanted = extendedTtl(session, add);
  if (wanted <= maxTtl) {
    return null;
  }
  if (currentTtl(session) >= maxTtl - 1) {
    return `This session already has the operator's maximum TTL of ${maxTtl} s (SandboxPolicy.max_ttl_seconds).`;
  }
  return (
    `${Math.round(add / 60)} more minutes would make its TTL ${wanted} s, over the operator's ` +
    `maximum of ${maxTtl} s (SandboxPolicy.max_ttl_seconds).`
  );
}

/** GET sessions/{id}'s `usage` (a provider fills what it can, null for the rest). */
export interface ISessionUsage {
  cpu_seconds?: number | null;
  memory_bytes?: number | null;
  memory_limit_bytes?: number | null;
  disk_bytes?: number | null;
  disk_partial?: boolean | null;
  note?: string | null;
  measured_at?: number | null;
}

/** Binary units, compact: `512 B`, `1.5 KiB`, `20 MiB`, `3.2 GiB`. */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) {
    return '?';
  }
  if (bytes < 1024) {
    return `${Math.round(bytes)} B`;
  }
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

/** `0.42 s`, `12 s`, `3m 20s` of CPU time. */
export function formatCpu(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) {
    return '?';
  }
  if (seconds < 10) {
    return `${seconds.toFixed(2)} s`;
  }
  if (seconds < 60) {
    return `${Math.round(seconds)} s`;
  }
  const s = Math.round(seconds);
  return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, '0')}s`;
}

const isNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);

/**
 * One line: `cpu 1.20 s · mem 20 MiB / 512 MiB · disk 4.0 KiB`; a field the
 * provider cannot measure is left out; null when nothing at all is known.
 */
export function usageText(usage: ISessionUsage | null | undefined): string | null {
  if (!usage || typeof usage !== 'object') {
    return null;
  }
  const parts: string[] = [];
  if (isNumber(usage.cpu_seconds)) {
    parts.push(`cpu ${formatCpu(usage.cpu_seconds)}`);
  }
  if (isNumber(usage.memory_bytes)) {
    const limit = isNumber(usage.memory_limit_bytes) ? ` / ${formatBytes(usage.memory_limit_bytes)}` : '';
    parts.push(`mem ${formatBytes(usage.memory_bytes)}${limit}`);
  }
  if (isNumber(usage.disk_bytes)) {
    parts.push(`disk ${usage.disk_partial ? '≥ ' : ''}${formatBytes(usage.disk_bytes)}`);
  }
  if (parts.length) {
    return parts.join(' · ');
  }
  return usage.note ? 'not measured' : null;
}

/** The tooltip: what was measured when, and the provider's note on what it could not measure. */
export function usageTitle(usage: ISessionUsage | null | undefined): string {
  if (!usage) {
    return '';
  }
  const lines: string[] = [];
  if (isNumber(usage.measured_at)) {
    lines.push(`measured at ${new Date(usage.measured_at * 1000).toLocaleTimeString()}`);
  }
  if (usage.disk_partial) {
    lines.push('disk: a lower bound (the walk stopped at its limit)');
  }
  if (usage.note) {
    lines.push(usage.note);
  }
  return lines.join('\n');
}
