/**
 * The panel's state: the kind row and the live sessions, refreshed by a poll,
 * with the transitions a user should be told about (server lost, server back).
 * Nothing here touches the DOM.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { ISessionInfo, IStatus, SandboxClient } from './api';
import { IKernelUser, ISessionUsage, kernelIdOf, usersByKernel } from './kernels';
import { SandboxAPIError } from './request';
import { ISessionUsageHistory } from './usage';

/**
 * ok: a provider answers; off: no provider; unavailable: the server says in JSON
 * why its provider cannot run (503, e.g. a misspelled provider); unreachable: no
 * server; error: the server failed.
 */
export type Connection = 'loading' | 'ok' | 'off' | 'unavailable' | 'unreachable' | 'error';

export interface IPanelState {
  connection: Connection;
  status: IStatus | null;
  sessions: ISessionInfo[];
  /** Date.now() when `sessions` was fetched (their seconds_left are relative to it). */
  fetchedAt: number;
  /** What went wrong, for the status row, when connection is unreachable or error. */
  problem: string | null;
  /** Kernel id -> the notebooks it serves (jupyter_server's sessions), for kernel sessions. */
  kernels: Record<string, IKernelUser[]>;
  /** Session id -> its last measured resource use (the last measure of GET usage). */
  usage: Record<string, ISessionUsage>;
  /** Session id -> its recent samples and what it serves (GET usage), for the sparklines. */
  history: Record<string, ISessionUsageHistory>;
}

export const INITIAL_STATE: IPanelState = {
  connection: 'loading',
  status: null,
  sessions: [],
  fetchedAt: 0,
  problem: null,
  kernels: {},
  usage: {},
  history: {}
};

/** A message for the user when the state changes in a way they must hear about. */
export interface INotice {
  level: 'error' | 'success' | 'info';
  message: string;
  /** The whole text is in the panel: the notification offers to show it. */
  showPanel?: boolean;
}

/** The state after a successful fetch. */
export function stateFromFetch(
  status: IStatus,
  sessions: ISessionInfo[],
  now: number,
  extra: {
    kernels?: Record<string, IKernelUser[]>;
    usage?: Record<string, ISessionUsage>;
    history?: Record<string, ISessionUsageHistory>;
  } = {}
): IPanelState {
  const off = status.kind === 'off';
  const live = new Set(off ? [] : sessions.map(s => s.id));
  const usage = onlyLive(extra.usage ?? {}, live);
  const history = onlyLive(extra.history ?? {}, live);
  return {
    connection: off ? 'off' : 'ok',
    status,
    sessions: off ? [] : sortSessions(sessions),
    fetchedAt: now,
    problem: null,
    kernels: off ? {} : (extra.kernels ?? {}),
    usage,
    history
  };
}

/** The entries of the sessions in `live`. */
function onlyLive<T>(byId: Record<string, T>, live: Set<string>): Record<string, T> {
  const kept: Record<string, T> = {};
  for (const [id, value] of Object.entries(byId)) {
    if (live.has(id)) {
      kept[id] = value;
    }
  }
  return kept;
}

/** True when some session is a sandboxed kernel's (its notebook is worth looking up). */
export function hasKernelSessions(sessions: ISessionInfo[]): boolean {
  return sessions.some(s => kernelIdOf(s.consumer) !== null);
}

/** The state after a failed fetch: keep what we knew, say what failed. */
export function stateFromError(prev: IPanelState, error: unknown): IPanelState {
  const unreachable = error instanceof SandboxAPIError && error.unreachable;
  const unavailable = isTypedError(error) && error.status === 503;
  return {
    ...prev,
    connection: unreachable ? 'unreachable' : unavailable ? 'unavailable' : 'error',
    sessions: unavailable ? [] : prev.sessions,
    problem: describeError(error)
  };
}

/** A JSON error of the sandbox API (not an HTML page, not a lost connection). */
export function isTypedError(error: unknown): error is SandboxAPIError {
  return (
    error instanceof SandboxAPIError &&
    !error.unreachable &&
    !['HTTPError', 'BadResponse', 'NetworkError'].includes(error.error)
  );
}

/** The notice (if any) for going from one state to the next. */
export function transitionNotice(prev: IPanelState, next: IPanelState): INotice | null {
  const lost = (c: Connection) => c === 'unreachable' || c === 'error' || c === 'unavailable';
  if (next.connection === 'unavailable' && prev.connection !== 'unavailable') {
    // the server said why, in JSON: the panel shows the whole message
    return {
      level: 'error',
      message: 'The sandbox is unavailable: the Sandbox panel shows why and how to fix it.',
      showPanel: true
    };
  }
  if (lost(next.connection) && !lost(prev.connection)) {
    return {
      level: 'error',
      message:
        next.connection === 'unreachable'
          ? `Sandbox panel: ${next.problem ?? 'the server is unreachable.'} Retrying…`
          : 'Sandbox panel: the server failed; the Sandbox panel shows its whole answer.',
      showPanel: next.connection !== 'unreachable'
    };
  }
  if (!lost(next.connection) && lost(prev.connection)) {
    return { level: 'success', message: 'Sandbox panel: the server answers again.' };
  }
  if (next.connection === 'off' && prev.connection === 'ok') {
    return { level: 'info', message: `Sandbox provider is off. ${next.status?.message ?? ''}`.trim() };
  }
  return null;
}

/** A readable message for any error (never a stack trace). */
export function describeError(error: unknown): string {
  if (error instanceof SandboxAPIError) {
    return error.message.trim() || `${error.error} (${error.status})`;
  }
  if (error instanceof Error) {
    return error.message;
  }
  return String(error);
}

/** Newest first, so a session just created shows at the top. */
export function sortSessions(sessions: ISessionInfo[]): ISessionInfo[] {
  return [...sessions].sort((a, b) => b.created_at - a.created_at || a.id.localeCompare(b.id));
}

/** Seconds before the reaper takes a session, counted down from the last fetch. */
export function secondsLeft(session: ISessionInfo, fetchedAt: number, now: number): number {
  return Math.max(0, session.seconds_left - Math.max(0, now - fetchedAt) / 1000);
}

/** `45s`, `12m 05s`, `3h 20m`, `2d 4h`; `expired` at zero. */
export function formatDuration(seconds: number): string {
  const s = Math.floor(seconds);
  if (s <= 0) {
    return 'expired';
  }
  const pad = (n: number) => String(n).padStart(2, '0');
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
  }
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

/** The one-line summary of the kind row. */
export function statusLine(state: IPanelState): string {
  switch (state.connection) {
    case 'loading':
      return 'Loading…';
    case 'unreachable':
    case 'unavailable':
    case 'error':
      return state.problem ?? 'The server failed.';
    case 'off':
      return state.status?.message || 'No sandbox provider is configured.';
    default: {
      const status = state.status;
      if (!status) {
        return '';
      }
      const floor = status.policy?.isolation ?? '?';
      const ceiling = status.policy?.egress ?? '?';
      return `Provider ${status.kind} · isolation floor ${floor} · network ceiling ${ceiling}`;
    }
  }
}

/** The words the panel uses where a user decides, for a provider with no isolation at all. */
export const NO_ISOLATION = 'No isolation: code runs on this host as you.';

/**
 * Why New session cannot succeed whatever the form says (the operator's isolation
 * floor over what the provider gives), or null. The server says it in its own
 * words (they name its option); an older server's status is read the same way.
 */
export function createBlockedReason(status: IStatus | null | undefined): string | null {
  if (!status || status.kind === 'off') {
    return null;
  }
  if (status.create_refused) {
    return status.create_refused;
  }
  const floor = status.policy?.isolation;
  const max = status.max_isolation;
  if (floor && max && ISOLATION_ORDER.indexOf(floor) > ISOLATION_ORDER.indexOf(max)) {
    return (
      `every session create is refused: the isolation floor is '${floor}' but the ` +
      `${status.kind} provider gives '${max}' at most. Lower the floor ` +
      `(--SandboxPolicy.isolation=${max} or TAI_MCP_SANDBOX_ISOLATION=${max}) and restart the server, ` +
      'or use a stronger provider.'
    );
  }
  return null;
}

/**
 * The isolation warning where a user decides: no isolation at all (local), or the provider's own note
 * on an isolation weaker than its level says (a vm under emulation), else null.
 */
export function isolationWarning(status: IStatus | null | undefined): string | null {
  if (!status || status.kind === 'off' || createBlockedReason(status)) {
    return null;
  }
  if (status.max_isolation === 'none') {
    return NO_ISOLATION;
  }
  return status.isolation_note ? `Isolation: ${status.isolation_note}.` : null;
}

const ISOLATION_ORDER = ['none', 'container', 'vm'];

/** `1 CPU`, `2.5 CPUs`. */
export function formatCpus(cpus: number): string {
  return `${cpus} ${cpus === 1 ? 'CPU' : 'CPUs'}`;
}

/** `512 MB`, `1 GiB` (whole GiB), `1536 MB`. */
export function formatMemoryMb(mb: number): string {
  return mb >= 1024 && mb % 1024 === 0 ? `${mb / 1024} GiB` : `${mb} MB`;
}

/**
 * What an empty CPUs / Memory field means, and the most it takes: the operator's
 * default and maximum (`status.limits`); 0 or absent is no limit / no maximum.
 */
export function limitHints(status: IStatus | null | undefined): {
  cpu: { placeholder: string; hint: string };
  memory: { placeholder: string; hint: string };
} {
  if (status?.supports_limits === false) {
    const none = { placeholder: 'not supported', hint: `the ${status.kind} provider cannot enforce limits` };
    return { cpu: none, memory: none };
  }
  const limits = status?.limits ?? {};
  const describe = (
    def: number | undefined,
    max: number | undefined,
    format: (n: number) => string
  ): { placeholder: string; hint: string } => {
    const hasDefault = typeof def === 'number' && def > 0;
    const hasMax = typeof max === 'number' && max > 0;
    // the provider caps its default at the maximum
    const given = hasDefault ? (hasMax ? Math.min(def!, max!) : def!) : 0;
    const placeholder = hasDefault ? `default ${format(given)}` : 'no limit';
    const parts = [hasDefault ? `empty: ${format(given)}` : 'empty: no limit'];
    parts.push(hasMax ? `at most ${format(max!)}` : 'no maximum');
    return { placeholder, hint: `${parts.join(', ')} (the operator's settings)` };
  };
  return {
    cpu: describe(limits.default_cpu, limits.max_cpu, formatCpus),
    memory: describe(limits.default_memory_mb, limits.max_memory_mb, formatMemoryMb)
  };
}

export namespace SessionsModel {
  export interface IOptions {
    client: SandboxClient;
    /** Seconds between two refreshes (backs off while the server is unreachable). */
    interval?: number;
    /** When true the poll sleeps (e.g. while the panel is hidden); default: when the page is hidden. */
    standby?: () => boolean;
    /**
     * Seconds between two fetches of the sessions' recent resource use (one GET usage for all of
     * them, in the background, while the poll runs); 0 (default): never.
     */
    usageInterval?: number;
  }
}

/** The live state, refreshed by a poll; `changed` fires on each new state. */
export class SessionsModel {
  constructor(options: SessionsModel.IOptions) {
    this.client = options.client;
    this._interval = (options.interval ?? 3) * 1000;
    this._standby = options.standby ?? (() => false);
    this._usageEvery = this._usageFloor = (options.usageInterval ?? 0) * 1000;
  }

  readonly client: SandboxClient;

  get state(): IPanelState {
    return this._state;
  }

  get changed(): ISignal<this, IPanelState> {
    return this._changed;
  }

  /** Notices to show the user (connection lost / back / provider off). */
  get notice(): ISignal<this, INotice> {
    return this._notice;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Start polling (standby while the page is hidden, backoff while failing). */
  start(): void {
    if (this._poll) {
      return;
    }
    this._poll = new Poll({
      factory: () => this.refresh(true),
      frequency: { interval: this._interval, backoff: true, max: 10 * 1000 },
      name: 'jupyter-tai-sandbox:sessions',
      standby: () => this._standby() || 'when-hidden'
    });
  }

  /** Change the poll interval (seconds). */
  setInterval(seconds: number): void {
    this._interval = Math.max(1, seconds) * 1000;
    if (this._poll) {
      this._poll.frequency = { ...this._poll.frequency, interval: this._interval };
    }
  }

  /**
   * Fetch the kind row and the sessions now. Resolves with the new state;
   * with `rethrow`, a failure rejects after updating the state (so a Poll backs off).
   */
  async refresh(rethrow = false): Promise<IPanelState> {
    let next: IPanelState;
    try {
      const status = await this.client.status();
      const sessions = status.kind === 'off' ? [] : await this.client.listSessions();
      const kernels = hasKernelSessions(sessions) ? await this._kernelUsers() : {};
      next = stateFromFetch(status, sessions, Date.now(), {
        kernels,
        usage: this._state.usage,
        history: this._state.history
      });
    } catch (error) {
      this._set(stateFromError(this._state, error));
      if (rethrow) {
        throw error;
      }
      return this._state;
    }
    this._set(next);
    this._measureSoon(next);
    return next;
  }

  /**
   * Fetch the sessions' recent resource use now: one GET usage answers all of them (the server's
   * sampler measured them; the request measures nothing). A failure keeps what was known.
   */
  async refreshUsage(): Promise<void> {
    let answer;
    try {
      answer = await this.client.usage();
    } catch {
      return;
    }
    if (this._isDisposed || !Array.isArray(answer?.sessions)) {
      return;
    }
    if (typeof answer.interval_seconds === 'number' && answer.interval_seconds > 0 && this._usageEvery) {
      // never ask more often than the server samples
      this._usageEvery = Math.max(this._usageFloor, answer.interval_seconds * 1000);
    }
    const live = new Set(this._state.sessions.map(s => s.id));
    const usage: Record<string, ISessionUsage> = {};
    const history: Record<string, ISessionUsageHistory> = {};
    for (const entry of answer.sessions) {
      if (!entry || typeof entry.id !== 'string' || !live.has(entry.id)) {
        continue;
      }
      history[entry.id] = entry;
      if (entry.last) {
        usage[entry.id] = entry.last;
      }
    }
    this._set({ ...this._state, usage, history });
  }

  /** Replace a session's row with the server's answer (after a TTL change), counting down from now. */
  updateLocally(session: ISessionInfo, now = Date.now()): void {
    if (!this._state.sessions.some(s => s.id === session.id)) {
      return;
    }
    this.addLocally(session, now);
  }

  /** kernel id -> notebooks, from jupyter_server; a failure keeps what was known. */
  private async _kernelUsers(): Promise<Record<string, IKernelUser[]>> {
    try {
      return usersByKernel(await this.client.jupyterSessions());
    } catch {
      return this._state.kernels;
    }
  }

  private _measureSoon(state: IPanelState): void {
    if (!this._usageEvery || this._measuring || state.connection !== 'ok' || !state.sessions.length) {
      return;
    }
    const now = Date.now();
    if (now - this._measuredAt < this._usageEvery) {
      return;
    }
    this._measuredAt = now;
    this._measuring = true;
    void this.refreshUsage().finally(() => {
      this._measuring = false;
    });
  }

  /** Refresh at once and restart the poll's clock (after a create or a destroy). */
  async refreshSoon(): Promise<void> {
    if (this._poll) {
      await this._poll.refresh();
      await this._poll.tick;
    } else {
      await this.refresh();
    }
  }

  /** Forget a session at once (after a destroy), without waiting for the poll. */
  removeLocally(id: string): void {
    const sessions = this._state.sessions.filter(s => s.id !== id);
    if (sessions.length !== this._state.sessions.length) {
      this._set({ ...this._state, sessions });
    }
  }

  /** Show a session at once (after a create), without waiting for the poll. */
  addLocally(session: ISessionInfo, now = Date.now()): void {
    const fetchedAt = this._state.fetchedAt || now;
    // seconds_left is relative to `now`; the list counts down from fetchedAt
    const shifted = {
      ...session,
      seconds_left: session.seconds_left + Math.max(0, now - fetchedAt) / 1000
    };
    const others = this._state.sessions.filter(s => s.id !== session.id);
    this._set({ ...this._state, sessions: sortSessions([shifted, ...others]), fetchedAt });
  }

  /** The session with that id, if the last fetch saw it. */
  find(id: string): ISessionInfo | undefined {
    return this._state.sessions.find(s => s.id === id);
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._poll?.dispose();
    Signal.clearData(this);
  }

  private _set(next: IPanelState): void {
    const prev = this._state;
    this._state = next;
    const notice = transitionNotice(prev, next);
    this._changed.emit(next);
    if (notice) {
      this._notice.emit(notice);
    }
  }

  private _state: IPanelState = INITIAL_STATE;
  private _interval: number;
  private _standby: () => boolean;
  private _poll: Poll | null = null;
  private _usageEvery = 0;
  private _usageFloor = 0;
  private _measuredAt = 0;
  private _measuring = false;
  private _isDisposed = false;
  private _changed = new Signal<this, IPanelState>(this);
  private _notice = new Signal<this, INotice>(this);
}
