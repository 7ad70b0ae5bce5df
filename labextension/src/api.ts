/**
 * Typed client of the sandbox REST API and the exec websocket URL.
 * The shapes mirror jupyter_tai_sandbox/api.yaml.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { API_NAMESPACE, requestAPI, requestRaw } from './request';

export type Isolation = 'none' | 'container' | 'vm';
export type Network = 'egress' | 'internal' | 'none';
export type Durability = 'ephemeral' | 'persistent';

export interface IPolicy {
  isolation: Isolation;
  egress: Network;
  durable: boolean;
  scrub_transcript: boolean;
  credentials: Record<string, string[]>;
}

/** GET status: the kind row. `kind` is "off" when no provider is configured. */
export interface IStatus {
  kind: string;
  message?: string;
  max_isolation?: Isolation;
  networks?: Network[];
  supports_limits?: boolean;
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
  spec: Record<string, unknown>;
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

/** A workspace path as URL parts: `a b/c` -> `a%20b/c`; leading/trailing slashes dropped. */
export function filePathUrl(path: string): string {
  const clean = path
    .split('/')
    .filter(part => part && part !== '.')
    .join('/');
  return URLExt.encodeParts(clean);
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

  /**
   * Upload a file (the browser streams a File/Blob body from disk).
   * Parent folders are created by the server.
   */
  upload(
    id: string,
    path: string,
    body: Blob | ArrayBuffer | string
  ): Promise<{ path: string; size: number }> {
    return requestAPI<{ path: string; size: number }>(
      this._files(id, path),
      {
        method: 'PUT',
        body,
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
