/**
 * A main-area tab browsing a session's workspace: folders, download, and
 * upload by button or drag-and-drop (the browser streams each File body).
 */
import { Notification } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IFileEntry, IListing, SandboxClient } from './api';
import { describeError } from './model';
import { shortId } from './terminal';

export namespace SandboxFiles {
  export interface IOptions {
    client: SandboxClient;
    sessionId: string;
  }
}

/** `a/b` + `c` -> `a/b/c`; `` + `c` -> `c`. */
export function joinPath(folder: string, name: string): string {
  return folder ? `${folder.replace(/\/+$/, '')}/${name}` : name;
}

/** The parent of a workspace folder (`a/b` -> `a`, `a` -> ``). */
export function parentPath(folder: string): string {
  const parts = folder.split('/').filter(Boolean);
  parts.pop();
  return parts.join('/');
}

/** `1.2 kB`-style sizes. */
export function formatSize(size: number): string {
  if (size < 1024) {
    return `${size} B`;
  }
  const units = ['kB', 'MB', 'GB', 'TB'];
  let value = size / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

export class SandboxFiles extends Widget {
  constructor(options: SandboxFiles.IOptions) {
    super();
    this._client = options.client;
    this.sessionId = options.sessionId;
    this.id = `tai-sandbox-files-${options.sessionId}`;
    this.addClass('jp-TaiSandbox-files');
    this.node.dataset.sessionId = options.sessionId;
    this.title.label = `Files ${shortId(options.sessionId)}`;
    this.title.caption = `Workspace of sandbox session ${options.sessionId}`;
    this.title.closable = true;

    const toolbar = document.createElement('div');
    toolbar.className = 'jp-TaiSandbox-filesToolbar';
    this._up = button('Up', 'Parent folder', () => this.cd(parentPath(this._path)));
    const refresh = button('Refresh', 'List the folder again', () => void this.refresh());
    const upload = button('Upload…', 'Upload files into this folder', () => this._input.click());
    upload.classList.add('jp-TaiSandbox-upload');
    this._input = document.createElement('input');
    this._input.type = 'file';
    this._input.multiple = true;
    this._input.className = 'jp-TaiSandbox-uploadInput';
    this._input.addEventListener('change', () => {
      const files = Array.from(this._input.files ?? []);
      this._input.value = '';
      void this.uploadFiles(files);
    });
    this._pathLabel = document.createElement('span');
    this._pathLabel.className = 'jp-TaiSandbox-path';
    toolbar.append(this._up, refresh, upload, this._input, this._pathLabel);

    this._table = document.createElement('table');
    this._table.className = 'jp-TaiSandbox-fileTable';
    this._message = document.createElement('div');
    this._message.className = 'jp-TaiSandbox-filesMessage';
    const hint = document.createElement('div');
    hint.className = 'jp-TaiSandbox-dropHint';
    hint.textContent = 'Drop files here to upload them into this folder.';

    this.node.append(toolbar, this._message, this._table, hint);
  }

  readonly sessionId: string;

  /** The folder shown, relative to the workspace ('' is the workspace). */
  get path(): string {
    return this._path;
  }

  async cd(path: string): Promise<void> {
    this._path = path;
    await this.refresh();
  }

  async refresh(): Promise<void> {
    const path = this._path;
    this._pathLabel.textContent = `/${path}`;
    this._up.disabled = !path;
    let listing: IListing;
    try {
      listing = await this._client.listFiles(this.sessionId, path);
    } catch (error) {
      const message = `Cannot list /${path}: ${describeError(error)}`;
      this._message.textContent = message;
      this._message.classList.add('jp-mod-error');
      Notification.error(message, { autoClose: 8000 });
      return;
    }
    if (path !== this._path) {
      return; // a later cd won
    }
    this._message.textContent = listing.entries.length ? '' : 'This folder is empty.';
    this._message.classList.remove('jp-mod-error');
    this._render(listing.entries);
  }

  /** Upload files into the current folder, one request each, reporting each result. */
  async uploadFiles(files: File[]): Promise<void> {
    for (const file of files) {
      const target = joinPath(this._path, file.name);
      const done = this._client.upload(this.sessionId, target, file);
      Notification.promise(done, {
        pending: { message: `Uploading ${target} (${formatSize(file.size)})…`, options: {} },
        success: {
          message: () => `Uploaded ${target}.`,
          options: { autoClose: 3000 }
        },
        error: {
          message: (error: unknown) => `Upload of ${target} failed: ${describeError(error)}`,
          options: { autoClose: 10000 }
        }
      });
      try {
        await done;
      } catch {
        // reported by the notification
      }
    }
    await this.refresh();
  }

  async downloadFile(path: string): Promise<void> {
    let blob: Blob;
    try {
      blob = await this._client.download(this.sessionId, path);
    } catch (error) {
      Notification.error(`Download of ${path} failed: ${describeError(error)}`, {
        autoClose: 8000
      });
      return;
    }
    const url = URL.createObjectURL(blob);
    const a = document.createElement('a');
    a.href = url;
    a.download = path.split('/').pop() || 'download';
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  }

  /** Closing the tab disposes the widget (for a terminal: kills its command). */
  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    this.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this.node.addEventListener('dragover', this);
    this.node.addEventListener('dragleave', this);
    this.node.addEventListener('drop', this);
    void this.refresh();
  }

  protected onBeforeDetach(msg: Message): void {
    this.node.removeEventListener('dragover', this);
    this.node.removeEventListener('dragleave', this);
    this.node.removeEventListener('drop', this);
    super.onBeforeDetach(msg);
  }

  handleEvent(event: Event): void {
    const drag = event as DragEvent;
    switch (event.type) {
      case 'dragover':
        if (drag.dataTransfer?.types.includes('Files')) {
          drag.preventDefault();
          drag.dataTransfer.dropEffect = 'copy';
          this.addClass('jp-mod-dropTarget');
        }
        break;
      case 'dragleave':
        this.removeClass('jp-mod-dropTarget');
        break;
      case 'drop': {
        this.removeClass('jp-mod-dropTarget');
        const files = Array.from(drag.dataTransfer?.files ?? []);
        if (files.length) {
          drag.preventDefault();
          drag.stopPropagation();
          void this.uploadFiles(files);
        }
        break;
      }
    }
  }

  private _render(entries: IFileEntry[]): void {
    const sorted = [...entries].sort(
      (a, b) =>
        Number(b.type === 'directory') - Number(a.type === 'directory') ||
        a.name.localeCompare(b.name)
    );
    const body = document.createElement('tbody');
    for (const entry of sorted) {
      const row = document.createElement('tr');
      row.className = 'jp-TaiSandbox-fileRow';
      row.dataset.name = entry.name;
      row.dataset.type = entry.type;
      const path = joinPath(this._path, entry.name);

      const name = document.createElement('td');
      const link = document.createElement('a');
      link.className = 'jp-TaiSandbox-fileName';
      link.textContent = entry.type === 'directory' ? `${entry.name}/` : entry.name;
      link.href = '#';
      link.title = entry.type === 'directory' ? `Open ${path}` : `Download ${path}`;
      link.addEventListener('click', ev => {
        ev.preventDefault();
        if (entry.type === 'directory') {
          void this.cd(path);
        } else {
          void this.downloadFile(path);
        }
      });
      name.appendChild(link);

      const size = document.createElement('td');
      size.textContent = entry.type === 'directory' ? '' : formatSize(entry.size);
      const mtime = document.createElement('td');
      mtime.textContent = entry.mtime ? new Date(entry.mtime * 1000).toLocaleString() : '';
      const actions = document.createElement('td');
      if (entry.type !== 'directory') {
        actions.appendChild(
          button('Download', `Download ${path}`, () => void this.downloadFile(path))
        );
      }
      row.append(name, size, mtime, actions);
      body.appendChild(row);
    }
    this._table.replaceChildren(body);
  }

  private _client: SandboxClient;
  private _path = '';
  private _up: HTMLButtonElement;
  private _input: HTMLInputElement;
  private _pathLabel: HTMLElement;
  private _table: HTMLTableElement;
  private _message: HTMLElement;
}

/** A small JupyterLab-styled button. */
export function button(label: string, title: string, onClick: () => void): HTMLButtonElement {
  const b = document.createElement('button');
  b.className = 'jp-Button jp-mod-styled jp-mod-small jp-TaiSandbox-button';
  b.textContent = label;
  b.title = title;
  b.addEventListener('click', ev => {
    ev.stopPropagation();
    onClick();
  });
  return b;
}
