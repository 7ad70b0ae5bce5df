/**
 * The "Sandbox" drive of JupyterLab's file browser: its top level lists the
 * user's sessions as folders (GET /api/sandbox/sessions), and under each the
 * session's workspace (the files API: list, download, upload, delete, rename,
 * make folder). Text files and notebooks open, edit and save in JupyterLab's
 * own editors; uploads and downloads work as in the default drive.
 *
 * Everything in a workspace was written by code in a sandbox, so nothing read from
 * the drive is trusted: a notebook's trust marks (each cell's `metadata.trusted`,
 * nbformat's `metadata.signature`) are stripped when it is read, and again when it
 * is saved, so JupyterLab renders its outputs as untrusted (sanitized HTML, no
 * JavaScript, no live SVG) and the workspace never holds a `trusted: true` we wrote.
 */
import { PathExt } from '@jupyterlab/coreutils';
import { Contents, ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { IFileEntry, ISessionInfo, SandboxClient } from './api';
import { SandboxAPIError } from './request';

export const DRIVE_NAME = 'Sandbox';

/** A drive path split into its session and the path inside that session's workspace. */
export interface IDrivePath {
  /** '' for the drive's top level (the list of sessions). */
  sessionId: string;
  /** '' for the workspace itself. */
  path: string;
}

/** `sbx-1/a/b.txt` -> {sessionId: 'sbx-1', path: 'a/b.txt'}; `` -> the top level. */
export function splitDrivePath(localPath: string): IDrivePath {
  const parts = localPath.split('/').filter(part => part && part !== '.');
  if (parts.some(part => part === '..')) {
    throw new SandboxAPIError(400, 'SandboxPathError', `${localPath}: ".." is not allowed in a path`);
  }
  return { sessionId: parts[0] ?? '', path: parts.slice(1).join('/') };
}

/** The drive path of a workspace path of a session. */
export function joinDrivePath(sessionId: string, path: string): string {
  return [sessionId, ...path.split('/')].filter(Boolean).join('/');
}

/** The folder holding a workspace path: `a/b.txt` -> `a`, `b.txt` -> ``. */
export function parentOf(path: string): string {
  const parts = path.split('/').filter(Boolean);
  parts.pop();
  return parts.join('/');
}

/** The last part of a path. */
export function baseName(path: string): string {
  return path.split('/').filter(Boolean).pop() ?? '';
}

/** Seconds since the epoch (the files API) -> an ISO date (the contents API). */
export function isoDate(seconds: number | null | undefined): string {
  const ms = typeof seconds === 'number' && isFinite(seconds) ? seconds * 1000 : 0;
  return new Date(ms).toISOString();
}

/** The contents type a workspace entry is shown as. */
export function entryType(entry: Pick<IFileEntry, 'name' | 'type'>): 'directory' | 'notebook' | 'file' {
  if (entry.type === 'directory') {
    return 'directory';
  }
  return entry.name.endsWith('.ipynb') ? 'notebook' : 'file';
}

const TEXT_TYPES: Record<string, string> = {
  '.json': 'application/json',
  '.ipynb': 'application/x-ipynb+json',
  '.md': 'text/markdown',
  '.html': 'text/html',
  '.htm': 'text/html',
  '.svg': 'image/svg+xml',
  '.csv': 'text/csv',
  '.py': 'text/x-python'
};

const BINARY_TYPES: Record<string, string> = {
  '.png': 'image/png',
  '.jpg': 'image/jpeg',
  '.jpeg': 'image/jpeg',
  '.gif': 'image/gif',
  '.pdf': 'application/pdf',
  '.zip': 'application/zip',
  '.gz': 'application/gzip'
};

/** A MIME type from the file name (as the default drive's server guesses it). */
export function guessMimetype(name: string, format: Contents.FileFormat): string {
  const ext = PathExt.extname(name).toLowerCase();
  return (
    TEXT_TYPES[ext] ??
    BINARY_TYPES[ext] ??
    (format === 'base64' ? 'application/octet-stream' : 'text/plain')
  );
}

/** A workspace entry as a contents model without content. */
export function entryModel(sessionId: string, folder: string, entry: IFileEntry): Contents.IModel {
  const type = entryType(entry);
  const date = isoDate(entry.mtime);
  return {
    name: entry.name,
    path: joinDrivePath(sessionId, folder ? `${folder}/${entry.name}` : entry.name),
    type,
    writable: true,
    created: date,
    last_modified: date,
    mimetype: type === 'directory' ? '' : guessMimetype(entry.name, null),
    content: null,
    format: null,
    size: type === 'directory' ? undefined : entry.size
  };
}

/** A session as a folder of the drive's top level. */
export function sessionModel(session: ISessionInfo): Contents.IModel {
  return {
    name: session.id,
    path: session.id,
    type: 'directory',
    writable: true,
    created: isoDate(session.created_at),
    last_modified: isoDate(session.created_at),
    mimetype: '',
    content: null,
    format: null
  };
}

/** A folder model; `content` is the list of child models, or null. */
export function folderModel(
  localPath: string,
  content: Contents.IModel[] | null,
  modified = 0
): Contents.IModel {
  const date = isoDate(modified);
  return {
    name: baseName(localPath),
    path: localPath,
    type: 'directory',
    writable: localPath !== '',
    created: date,
    last_modified: date,
    mimetype: '',
    content,
    format: content ? 'json' : null
  };
}

/** The format a file is read in when the caller does not say. */
export function defaultFormat(type: string, bytes: Uint8Array): Exclude<Contents.FileFormat, null> {
  if (type === 'notebook') {
    return 'json';
  }
  return isUtf8(bytes) ? 'text' : 'base64';
}

export function isUtf8(bytes: Uint8Array): boolean {
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    return true;
  } catch {
    return false;
  }
}

/** File bytes -> the `content` of a model in `format`. */
export function decodeContent(bytes: Uint8Array, format: Contents.FileFormat, name: string): any {
  if (format === 'base64') {
    return bytesToBase64(bytes);
  }
  const text = new TextDecoder('utf-8', { fatal: format === 'json' || format === 'text' }).decode(
    bytes
  );
  if (format === 'json') {
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new SandboxAPIError(400, 'BadContent', `${name} is not valid JSON: ${String(error)}`);
    }
  }
  return text;
}

/** The `content` of a save in `format` -> the bytes uploaded. */
export function encodeContent(content: unknown, format: Contents.FileFormat, type: string): Uint8Array {
  if (content === undefined || content === null) {
    return new Uint8Array(0);
  }
  if (format === 'base64') {
    return base64ToBytes(String(content));
  }
  if (format === 'json' || type === 'notebook' || typeof content !== 'string') {
    // nbformat's own layout: one-space indent, a final newline
    return new TextEncoder().encode(JSON.stringify(content, null, 1) + '\n');
  }
  return new TextEncoder().encode(content);
}

export function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

export function bytesToBase64(bytes: Uint8Array): string {
  let binary = '';
  const step = 0x8000;
  for (let i = 0; i < bytes.length; i += step) {
    binary += String.fromCharCode(...bytes.subarray(i, i + step));
  }
  return btoa(binary);
}

export function base64ToBytes(text: string): Uint8Array {
  const binary = atob(text.replace(/\s+/g, ''));
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) {
    bytes[i] = binary.charCodeAt(i);
  }
  return bytes;
}

/** A JSON object (not an array, not null). */
function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * A notebook without its trust marks: no cell's `metadata.trusted`, no top-level
 * `metadata.signature` (what nbformat's `strip_transient` drops before writing, and
 * what JupyterLab reads to render a cell's outputs as trusted: `CellModel.trusted`
 * comes from `metadata.trusted`). A copy; the input is not changed. Anything that is
 * not a notebook-shaped object is returned as it is.
 */
export function untrustNotebook<T>(content: T): T {
  if (!isObject(content) || !Array.isArray(content.cells)) {
    return content;
  }
  const out: Record<string, unknown> = { ...content };
  if (isObject(content.metadata) && 'signature' in content.metadata) {
    const { signature: _signature, ...metadata } = content.metadata;
    out.metadata = metadata;
  }
  out.cells = content.cells.map((cell: unknown) => {
    if (!isObject(cell) || !isObject(cell.metadata) || !('trusted' in cell.metadata)) {
      return cell;
    }
    const { trusted: _trusted, ...metadata } = cell.metadata;
    return { ...cell, metadata };
  });
  return out as T;
}

/** The `content` of a model read from or saved to the drive, trust stripped from notebooks. */
export function untrustContent(content: unknown, format: Contents.FileFormat, type: string): unknown {
  return type === 'notebook' || format === 'json' ? untrustNotebook(content) : content;
}

/** A new notebook, as nbformat.v4.new_notebook() makes it. */
export const EMPTY_NOTEBOOK = { cells: [], metadata: {}, nbformat: 4, nbformat_minor: 5 };

/**
 * The first free name of `Untitled Folder`, `untitled.txt`, `Untitled.ipynb`
 * (then `... 1`, `untitled1.txt`, `Untitled1.ipynb`), as Jupyter's server picks them.
 */
export function untitledName(taken: Iterable<string>, type: string, ext: string): string {
  const names = new Set(taken);
  let base: string;
  let suffix: string;
  let sep = '';
  if (type === 'directory') {
    base = 'Untitled Folder';
    suffix = '';
    sep = ' ';
  } else if (type === 'notebook') {
    base = 'Untitled';
    suffix = '.ipynb';
  } else {
    base = 'untitled';
    suffix = ext ? (ext.startsWith('.') ? ext : `.${ext}`) : '.txt';
  }
  for (let i = 0; ; i++) {
    const name = i === 0 ? `${base}${suffix}` : `${base}${sep}${i}${suffix}`;
    if (!names.has(name)) {
      return name;
    }
  }
}

/** The name of a copy of `name` in a folder holding `taken`: `a-Copy1.txt`, `a-Copy2.txt`... */
export function copyName(taken: Iterable<string>, name: string): string {
  const names = new Set(taken);
  const ext = name.endsWith('.tar.gz') ? '.tar.gz' : PathExt.extname(name);
  const stem = ext ? name.slice(0, -ext.length) : name;
  for (let i = 1; ; i++) {
    const candidate = `${stem}-Copy${i}${ext}`;
    if (!names.has(candidate)) {
      return candidate;
    }
  }
}

function refuse(message: string, status = 400, error = 'SandboxPathError'): never {
  throw new SandboxAPIError(status, error, message);
}

/** The Sandbox drive. */
export class SandboxDrive implements Contents.IDrive {
  constructor(client: SandboxClient, name = DRIVE_NAME) {
    this._client = client;
    this.name = name;
  }

  readonly name: string;

  get serverSettings(): ServerConnection.ISettings {
    return this._client.serverSettings;
  }

  get fileChanged(): ISignal<this, Contents.IChangedArgs> {
    return this._fileChanged;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    Signal.clearData(this);
  }

  async get(localPath: string, options?: Contents.IFetchOptions): Promise<Contents.IModel> {
    const { sessionId, path } = splitDrivePath(localPath);
    const withContent = options?.content !== false;
    if (!sessionId) {
      let sessions: ISessionInfo[] = [];
      if (withContent) {
        try {
          sessions = await this._client.listSessions();
        } catch (error) {
          // no provider (503, e.g. off or misspelled): an empty drive; the Sandbox panel says why
          if (!(error instanceof SandboxAPIError && error.status === 503)) {
            throw error;
          }
        }
      }
      return folderModel('', withContent ? sessions.map(sessionModel) : null);
    }
    if (!path) {
      return this._folder(sessionId, '', withContent);
    }
    const entry = await this._stat(sessionId, path);
    if (entry.type === 'directory') {
      return this._folder(sessionId, path, withContent, entry);
    }
    const model = entryModel(sessionId, parentOf(path), entry);
    if (!withContent) {
      return model;
    }
    const bytes = await this._client.read(sessionId, path);
    const type = options?.type && options.type !== 'directory' ? options.type : model.type;
    const format = options?.format ?? defaultFormat(type, bytes);
    return {
      ...model,
      type,
      format,
      mimetype: guessMimetype(entry.name, format),
      // never trusted: a session wrote it (its outputs render sanitized, scripts inert)
      content: untrustContent(decodeContent(bytes, format, path), format, type),
      size: bytes.length
    };
  }

  async getDownloadUrl(localPath: string): Promise<string> {
    const { sessionId, path } = splitDrivePath(localPath);
    if (!sessionId || !path) {
      refuse('Download a file, not a session folder.');
    }
    return this._client.fileUrl(sessionId, path);
  }

  async newUntitled(options: Contents.ICreateOptions = {}): Promise<Contents.IModel> {
    const { sessionId, path: folder } = splitDrivePath(options.path ?? '');
    if (!sessionId) {
      refuse('New files go inside a session folder (create sessions from the Sandbox panel).');
    }
    const type = options.type ?? 'file';
    const listing = await this._client.listFiles(sessionId, folder);
    const name = untitledName(
      listing.entries.map(e => e.name),
      type,
      options.ext ?? ''
    );
    const path = folder ? `${folder}/${name}` : name;
    if (type === 'directory') {
      await this._client.makeFolder(sessionId, path);
    } else {
      const body = type === 'notebook' ? encodeContent(EMPTY_NOTEBOOK, 'json', type) : new Uint8Array(0);
      await this._client.upload(sessionId, path, body);
    }
    const model = await this.get(joinDrivePath(sessionId, path), { content: false });
    this._fileChanged.emit({ type: 'new', oldValue: null, newValue: model });
    return model;
  }

  async delete(localPath: string): Promise<void> {
    const { sessionId, path } = splitDrivePath(localPath);
    if (!sessionId || !path) {
      refuse('A session folder is not deleted here: destroy the session from the Sandbox panel.');
    }
    await this._client.remove(sessionId, path);
    this._fileChanged.emit({ type: 'delete', oldValue: { path: localPath }, newValue: null });
  }

  async rename(oldLocalPath: string, newLocalPath: string): Promise<Contents.IModel> {
    const from = splitDrivePath(oldLocalPath);
    const to = splitDrivePath(newLocalPath);
    if (!from.sessionId || !from.path || !to.path) {
      refuse('Session folders cannot be renamed; rename files and folders inside them.');
    }
    if (from.sessionId !== to.sessionId) {
      refuse('Moving between sessions is not supported: copy the file, then delete it.');
    }
    await this._client.rename(from.sessionId, from.path, to.path);
    const model = await this.get(newLocalPath, { content: false });
    this._fileChanged.emit({ type: 'rename', oldValue: { path: oldLocalPath }, newValue: model });
    return model;
  }

  async save(
    localPath: string,
    options: Partial<Contents.IModel> & Contents.IContentProvisionOptions = {}
  ): Promise<Contents.IModel> {
    const { sessionId, path } = splitDrivePath(localPath);
    if (!sessionId || !path) {
      refuse('Files are saved inside a session folder.');
    }
    if (options.type === 'directory') {
      await this._client.makeFolder(sessionId, path);
    } else {
      const type = options.type ?? 'file';
      const format = options.format ?? null;
      // no trust written back (JupyterLab marks cells the user runs or adds as trusted)
      const bytes = encodeContent(untrustContent(options.content, format, type), format, type);
      const chunk = options.chunk;
      if (chunk !== undefined) {
        // a chunked upload (large files): kept here until its last chunk (-1)
        const parts = chunk === 1 ? [] : (this._chunks.get(localPath) ?? []);
        parts.push(bytes);
        if (chunk !== -1) {
          this._chunks.set(localPath, parts);
          return { ...(await this._placeholder(localPath)), size: undefined };
        }
        this._chunks.delete(localPath);
        await this._client.upload(sessionId, path, concat(parts));
      } else {
        await this._client.upload(sessionId, path, bytes);
      }
    }
    const model = await this.get(localPath, { content: false });
    this._fileChanged.emit({ type: 'save', oldValue: null, newValue: model });
    return model;
  }

  async copy(localPath: string, toLocalDir: string): Promise<Contents.IModel> {
    const from = splitDrivePath(localPath);
    const to = splitDrivePath(toLocalDir);
    if (!from.sessionId || !from.path || !to.sessionId) {
      refuse('Copy files inside session folders.');
    }
    const entry = await this._stat(from.sessionId, from.path);
    if (entry.type === 'directory') {
      refuse('Copying a folder is not supported; copy its files.');
    }
    const listing = await this._client.listFiles(to.sessionId, to.path);
    const name = copyName(
      listing.entries.map(e => e.name),
      entry.name
    );
    const target = to.path ? `${to.path}/${name}` : name;
    const bytes = await this._client.read(from.sessionId, from.path);
    await this._client.upload(to.sessionId, target, bytes);
    const model = await this.get(joinDrivePath(to.sessionId, target), { content: false });
    this._fileChanged.emit({ type: 'new', oldValue: null, newValue: model });
    return model;
  }

  // No checkpoints: the workspace keeps one version of each file.
  async createCheckpoint(localPath: string): Promise<Contents.ICheckpointModel> {
    return { id: 'none', last_modified: new Date().toISOString() };
  }

  async listCheckpoints(localPath: string): Promise<Contents.ICheckpointModel[]> {
    return [];
  }

  async restoreCheckpoint(localPath: string, checkpointID: string): Promise<void> {
    refuse('The Sandbox drive keeps no checkpoints.');
  }

  async deleteCheckpoint(localPath: string, checkpointID: string): Promise<void> {
    // nothing kept
  }

  private async _folder(
    sessionId: string,
    path: string,
    withContent: boolean,
    entry?: IFileEntry
  ): Promise<Contents.IModel> {
    const local = joinDrivePath(sessionId, path);
    if (!withContent) {
      return folderModel(local, null, entry?.mtime ?? 0);
    }
    const listing = await this._client.listFiles(sessionId, path);
    return folderModel(
      local,
      listing.entries.map(e => entryModel(sessionId, path, e)),
      entry?.mtime ?? 0
    );
  }

  /** The entry of `path` in its parent's listing; 404 when there is none. */
  private async _stat(sessionId: string, path: string): Promise<IFileEntry> {
    const name = baseName(path);
    const listing = await this._client.listFiles(sessionId, parentOf(path));
    const entry = listing.entries.find(e => e.name === name);
    if (!entry) {
      refuse(`No such file or folder: ${path}`, 404, 'SandboxNotFoundError');
    }
    return entry;
  }

  private async _placeholder(localPath: string): Promise<Contents.IModel> {
    const { sessionId, path } = splitDrivePath(localPath);
    return entryModel(sessionId, parentOf(path), {
      name: baseName(path),
      type: 'file',
      size: 0,
      mtime: Date.now() / 1000
    });
  }

  private _client: SandboxClient;
  private _isDisposed = false;
  private _chunks = new Map<string, Uint8Array[]>();
  private _fileChanged = new Signal<this, Contents.IChangedArgs>(this);
}
