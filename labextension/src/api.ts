/**
 * Typed client of the sandbox REST API and the exec websocket URL.
 * The shapes mirror jupyter_tai_sandbox/api.yaml.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ISessionUsage } from './kernels';
import { IUsageAnswer } from './usage';
import { API_NAMESPACE, apiUrl, errorFromResponse, requestAPI, requestRaw, SandboxAPIError } from './request';

export type Isolation = 'none' | 'container' | 'vm';
export type Network = 'egress' | 'internal' | 'none';
export type Durability = 'ephemeral' | 'persistent';

export interface IPolicy {
  isolation: Isolation;
  egress: Network;
  durable: boolean;
  scrub_transcript: boolean;
  credentials: Record<string, string[]>;
  /** Longest TTL a spec may ask for (0: no maximum). */
  max_ttl_seconds?: number;
}

/** The operator's cpu/memory settings of a provider with limits (0: no default limit / no maximum). */
export interface ILimits {
  default_cpu?: number;
  max_cpu?: number;
  default_memory_mb?: number;
  max_memory_mb?: number;
}

/** GET status: the kind row. `kind` is "off" when no provider is configured. */
export interface IStatus {
  kind: string;
  message?: string;
  max_isolation?: Isolation;
  /** it enforces a spec's egress policy (an egress gateway: docker); the others refuse one */
  egress_policy?: boolean;
  /** the provider's own words where its isolation is weaker than its level says (a vm under emulation) */
  isolation_note?: string;
  /** its sessions can be paused and resumed */
  pausable?: boolean;
  /** its sessions can be forked */
  forkable?: boolean;
  networks?: Network[];
  supports_limits?: boolean;
  limits?: ILimits;
  /** Present when every create is refused whatever the spec: why, and the server option that fixes it. */
  create_refused?: string;
  policy?: IPolicy;
}

export interface ISessionSpec {
  image?: string | null;
  isolation?: Isolation | null;
  network?: Network;
  durability?: Durability;
  workspace_key?: string | null;
  ttl_seconds?: number;
  cpu?: number | null;
  memory_mb?: number | null;
  env?: Record<string, string>;
  consumer?: string;
  /** with network "egress": the host names it may reach (allow null: any name on 80 and 443) and may not */
  egress?: IEgressRequest;
}

/** What a caller asks of a session's egress (create, or PATCH): never a secret (the operator grants those). */
export interface IEgressRequest {
  allow?: string[] | null;
  deny?: string[];
}

/** An operator's secret granted to a session: by name, the variable holding its placeholder, its hosts. */
export interface ISecretGrant {
  name: string;
  env: string;
  placeholder?: string;
  hosts: string[];
  query?: boolean;
  body?: boolean;
}

/** A session's egress policy in force (`spec.egress`): allow null admits any name on ports 80 and 443. */
export interface IEgressPolicy {
  allow: string[] | null;
  deny: string[];
  secrets: ISecretGrant[];
}

/** One decision of an egress gateway (GET egress/audit); never a secret's value. */
export interface IEgressAuditLine {
  time?: string;
  session?: string;
  kind?: string;
  host?: string;
  port?: number;
  decision?: string;
  reason?: string;
  secret?: string;
  count?: number;
}

export interface ISessionInfo {
  id: string;
  kind: string;
  consumer: string;
  image: string | null;
  isolation: Isolation;
  network: Network;
  durability: Durability;
  workspace_key: string | null;
  workspace: string;
  created_at: number;
  expires_at: number;
  seconds_left: number;
  /** every process of the session is frozen (its TTL still runs) */
  paused?: boolean;
  spec: Record<string, unknown>;
  owner?: string;
  /** Only in GET sessions/{id}: what the session uses now, as far as the provider can tell. */
  usage?: ISessionUsage;
}

/** GET sessions/{id}/ports: a TCP port listening in the session (its preview URL when the server gives it). */
export interface IListeningPort {
  port: number;
  address: string;
  url?: string;
  /** the port's own preview origin (the server's PreviewSettings.origin_template): `url` redirects there */
  origin?: string;
}

export interface IFileEntry {
  name: string;
  type: 'file' | 'directory' | 'symlink' | 'other';
  size: number;
  mtime?: number;
}

export interface IListing {
  path: string;
  entries: IFileEntry[];
}

/** GET sessions/{id}/execs: one running (or just ended, kept for a reattach) command. */
export interface IExecInfo {
  id: string;
  session_id: string;
  argv: string[];
  pty: boolean;
  started: number;
  owner: string;
  attached: boolean;
  running: boolean;
  offset: number;
}

/** A workspace path as URL parts: `a b/c` -> `a%20b/c`; leading/trailing slashes dropped. */
export function filePathUrl(path: string): string {
  const clean = path
    .split('/')
    .filter(part => part && part !== '.')
    .join('/');
  return URLExt.encodeParts(clean);
}

/** A session's transcript: an nbformat 4 notebook (its `metadata.jupyter_tai_sandbox` names the session). */
export interface ITranscriptNotebook {
  nbformat: number;
  nbformat_minor: number;
  metadata: { jupyter_tai_sandbox?: { session?: string; commands?: number; truncated?: boolean } } & Record<
    string,
    unknown
  >;
  cells: unknown[];
}

/** The client the panel uses: one instance per server connection. */
export class SandboxClient {
  constructor(
    readonly serverSettings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  status(): Promise<IStatus> {
    return requestAPI<IStatus>('status', {}, this.serverSettings);
  }

  async listSessions(): Promise<ISessionInfo[]> {
    const body = await requestAPI<{ sessions: ISessionInfo[] }>(
      'sessions',
      {},
      this.serverSettings
    );
    return body.sessions;
  }

  getSession(id: string): Promise<ISessionInfo> {
    return requestAPI<ISessionInfo>(this._session(id), {}, this.serverSettings);
  }

  createSession(spec: ISessionSpec): Promise<ISessionInfo> {
    return requestAPI<ISessionInfo>(
      'sessions',
      { method: 'POST', body: JSON.stringify(spec) },
      this.serverSettings
    );
  }

  /** Freeze every process of the session (`pause`), or let it run on (`resume`); the session's info. */
  setPaused(id: string, paused: boolean): Promise<ISessionInfo> {
    return requestAPI<ISessionInfo>(
      `${this._session(id)}/${paused ? 'pause' : 'resume'}`,
      { method: 'POST' },
      this.serverSettings
    );
  }

  /** A new session started from this one's state now (the new session's info). */
  fork(id: string): Promise<ISessionInfo> {
    return requestAPI<ISessionInfo>(`${this._session(id)}/fork`, { method: 'POST' }, this.serverSettings);
  }

  /** PATCH sessions/{id}: the session now ends `ttlSeconds` after its creation (400 over the maximum). */
  setTtl(id: string, ttlSeconds: number): Promise<ISessionInfo> {
    return requestAPI<ISessionInfo>(
      this._session(id),
      { method: 'PATCH', body: JSON.stringify({ ttl_seconds: ttlSeconds }) },
      this.serverSettings
    );
  }

  /**
   * PATCH sessions/{id} with `egress`: the session's new allow and deny lists (its new connections follow
   * within a second); 400 over the operator's rule, or where the provider cannot. `spec.egress` of the
   * answer is the policy in force.
   */
  setEgress(id: string, egress: IEgressRequest): Promise<ISessionInfo> {
    return requestAPI<ISessionInfo>(
      this._session(id),
      { method: 'PATCH', body: JSON.stringify({ egress }) },
      this.serverSettings
    );
  }

  /** GET egress/audit: the newest `limit` decisions of the session's egress gateway, oldest first. */
  async egressAudit(sessionId: string, limit = 50): Promise<IEgressAuditLine[]> {
    const query = `?session=${encodeURIComponent(sessionId)}&limit=${limit}`;
    const body = await requestAPI<{ lines?: IEgressAuditLine[] }>(`egress/audit${query}`, {}, this.serverSettings);
    return Array.isArray(body?.lines) ? body.lines : [];
  }

  /**
   * GET usage: the recent CPU, memory and disk samples of every session of the caller, in one request
   * (the server's sampler measures them while someone asks; a request measures nothing itself).
   */
  usage(): Promise<IUsageAnswer> {
    return requestAPI<IUsageAnswer>('usage', {}, this.serverSettings);
  }

  /**
   * jupyter_server's own GET /api/sessions (kernel id -> notebook path), not the
   * sandbox API: how the panel names the notebook a sandboxed kernel serves.
   */
  async jupyterSessions(): Promise<unknown[]> {
    const url = URLExt.join(this.serverSettings.baseUrl, 'api', 'sessions');
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, {}, this.serverSettings);
    } catch (error) {
      const detail = error instanceof Error ? error.message : String(error);
      throw new SandboxAPIError(0, 'NetworkError', `Cannot reach the Jupyter server (${detail}).`);
    }
    if (!response.ok) {
      throw await errorFromResponse(response);
    }
    const body = await response.json();
    return Array.isArray(body) ? body : [];
  }

  async destroySession(id: string, removeWorkspace = false): Promise<void> {
    const query = removeWorkspace ? '?remove_workspace=1' : '';
    await requestAPI<void>(
      this._session(id) + query,
      { method: 'DELETE' },
      this.serverSettings
    );
  }

  /** List a folder of the workspace ('' is the workspace itself). */
  async listFiles(id: string, path = ''): Promise<IListing> {
    const response = await requestRaw(
      this._files(id, path),
      {},
      this.serverSettings
    );
    const type = response.headers.get('Content-Type') || '';
    if (!type.startsWith('application/json')) {
      throw new Error(`${path} is a file, not a folder`);
    }
    return (await response.json()) as IListing;
  }

  /** Download a file of the workspace. */
  async download(id: string, path: string): Promise<Blob> {
    const response = await requestRaw(
      this._files(id, path),
      {},
      this.serverSettings
    );
    return response.blob();
  }

  /** Download a file of the workspace as bytes. */
  async read(id: string, path: string): Promise<Uint8Array> {
    const response = await requestRaw(this._files(id, path), {}, this.serverSettings);
    return new Uint8Array(await response.arrayBuffer());
  }

  /** Delete a file, or a folder with everything in it. */
  async remove(id: string, path: string): Promise<void> {
    await requestAPI<void>(this._files(id, path), { method: 'DELETE' }, this.serverSettings);
  }

  /** Rename or move inside the workspace; 409 when `newPath` exists. */
  async rename(id: string, path: string, newPath: string): Promise<void> {
    await requestAPI<unknown>(
      this._files(id, path),
      { method: 'PATCH', body: JSON.stringify({ path: newPath }) },
      this.serverSettings
    );
  }

  /** Make a folder (and its parents). */
  async makeFolder(id: string, path: string): Promise<void> {
    await requestAPI<unknown>(
      this._files(id, path),
      { method: 'POST', body: JSON.stringify({ type: 'directory' }) },
      this.serverSettings
    );
  }

  /** The session's interactive commands (running, or ended and kept for a reattach). */
  async listExecs(id: string): Promise<IExecInfo[]> {
    const body = await requestAPI<{ execs: IExecInfo[] }>(
      `${this._session(id)}/execs`,
      {},
      this.serverSettings
    );
    return body.execs;
  }

  /** GET sessions/{id}/ports: the TCP ports listening in the session (as the session agent reads them). */
  async listPorts(id: string): Promise<IListeningPort[]> {
    const body = await requestAPI<{ ports?: IListeningPort[] }>(`${this._session(id)}/ports`, {}, this.serverSettings);
    return Array.isArray(body?.ports) ? body.ports : [];
  }

  /**
   * GET sessions/{id}/transcript.ipynb: the session's commands and their output as an nbformat 4 notebook
   * (scrubbed, unsigned: it opens untrusted).
   */
  async transcript(id: string): Promise<ITranscriptNotebook> {
    return requestAPI<ITranscriptNotebook>(`${this._session(id)}/transcript.ipynb`, {}, this.serverSettings);
  }

  /** The URL a browser downloads a workspace file from (GET needs no XSRF token). */
  fileUrl(id: string, path: string): string {
    return apiUrl(this.serverSettings, this._files(id, path));
  }

  /**
   * Upload a file (the browser streams a File/Blob body from disk).
   * Parent folders are created by the server.
   */
  upload(
    id: string,
    path: string,
    body: Blob | ArrayBuffer | Uint8Array | string
  ): Promise<{ path: string; size: number }> {
    return requestAPI<{ path: string; size: number }>(
      this._files(id, path),
      {
        method: 'PUT',
        body: body as BodyInit,
        headers: { 'Content-Type': 'application/octet-stream' }
      },
      this.serverSettings
    );
  }

  /**
   * The exec websocket URL of a session, built as JupyterLab's terminal
   * builds its own: settings.wsUrl, plus the token when appendToken is set.
   */
  execUrl(id: string): string {
    const settings = this.serverSettings;
    let url = URLExt.join(
      settings.wsUrl,
      API_NAMESPACE,
      'sessions',
      encodeURIComponent(id),
      'exec',
      'ws'
    );
    if (settings.appendToken && settings.token) {
      url += `?token=${encodeURIComponent(settings.token)}`;
    }
    return url;
  }

  private _session(id: string): string {
    return `sessions/${encodeURIComponent(id)}`;
  }

  private _files(id: string, path: string): string {
    const encoded = filePathUrl(path);
    return `${this._session(id)}/files${encoded ? '/' + encoded : ''}`;
  }
}
