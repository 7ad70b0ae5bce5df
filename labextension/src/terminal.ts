/**
 * A main-area tab with an xterm.js terminal attached to a session's exec
 * websocket, on a pty. Closing the tab kills the command.
 */
import { ServerConnection } from '@jupyterlab/services';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';
import { FitAddon } from '@xterm/addon-fit';
import { Terminal } from '@xterm/xterm';
import '@xterm/xterm/css/xterm.css';

import { SandboxClient } from './api';
import { ExecConnection, ExecEnd, endMessage } from './exec';

export namespace SandboxTerminal {
  export interface IOptions {
    client: SandboxClient;
    sessionId: string;
    argv: string[];
    timeoutSeconds: number;
  }
}

export class SandboxTerminal extends Widget {
  constructor(options: SandboxTerminal.IOptions) {
    super();
    this._options = options;
    this.addClass('jp-TaiSandbox-terminal');
    this.node.dataset.sessionId = options.sessionId;
    this.id = `tai-sandbox-terminal-${options.sessionId}-${++SandboxTerminal._count}`;
    this.title.label = `Sandbox ${shortId(options.sessionId)}`;
    this.title.caption = `Terminal in sandbox session ${options.sessionId} (${options.argv.join(' ')})`;
    this.title.closable = true;

    this._host = document.createElement('div');
    this._host.className = 'jp-TaiSandbox-terminalHost';
    this.node.appendChild(this._host);

    this._term = new Terminal({
      cursorBlink: true,
      fontFamily: 'Menlo, Consolas, "DejaVu Sans Mono", monospace',
      fontSize: 13,
      scrollback: 5000,
      theme: { background: '#1e1e1e', foreground: '#e6e6e6' }
    });
    this._fit = new FitAddon();
    this._term.loadAddon(this._fit);
  }

  /** How the command ended, once it has. */
  get end(): ExecEnd | null {
    return this._connection?.end ?? null;
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (!this._opened) {
      this._opened = true;
      this._term.open(this._host);
      this._fitNow();
      this._connect();
    }
  }

  protected onActivateRequest(msg: Message): void {
    super.onActivateRequest(msg);
    this._term.focus();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._fitNow();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._fitNow();
  }

  /** Closing the tab disposes the widget (for a terminal: kills its command). */
  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    this.dispose();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._connection?.dispose(); // kills the command if it still runs
    this._term.dispose();
    super.dispose();
  }

  private _fitNow(): void {
    if (!this._opened || !this.isVisible) {
      return;
    }
    try {
      this._fit.fit();
    } catch {
      // not laid out yet
    }
  }

  private _connect(): void {
    const { client, sessionId, argv, timeoutSeconds } = this._options;
    const settings: ServerConnection.ISettings = client.serverSettings;
    const socket = new settings.WebSocket(client.execUrl(sessionId));
    const connection = new ExecConnection(socket as any, {
      argv,
      timeoutSeconds,
      pty: true,
      rows: this._term.rows,
      cols: this._term.cols
    });
    this._connection = connection;
    this.node.dataset.phase = 'connecting';

    connection.started.connect(() => {
      this.node.dataset.phase = 'running';
    });
    connection.output.connect((_, { data }) => {
      this._term.write(data);
    });
    connection.rejected.connect((_, { request, message }) => {
      this._term.write(`\r\n\x1b[33m[${request} refused: ${message}]\x1b[0m\r\n`);
    });
    connection.ended.connect((_, end) => this._onEnded(end));

    this._term.onData(data => connection.write(data));
    this._term.onBinary(data => {
      const bytes = Uint8Array.from(data, c => c.charCodeAt(0) & 0xff);
      connection.write(bytes);
    });
    this._term.onResize(({ rows, cols }) => {
      this._showSize();
      connection.resize(rows, cols);
    });
    this._showSize();
  }

  /** The pty size, readable by people (caption) and tests (data attributes). */
  private _showSize(): void {
    this.node.dataset.rows = String(this._term.rows);
    this.node.dataset.cols = String(this._term.cols);
  }

  private _onEnded(end: ExecEnd): void {
    if (this.isDisposed) {
      return;
    }
    this.node.dataset.phase = 'ended';
    const color = end.kind === 'exit' && end.exitCode === 0 ? '32' : '31';
    this._term.write(`\r\n\x1b[1;${color}m${endMessage(end)}\x1b[0m\r\n`);
    if (end.kind === 'exit') {
      this.node.dataset.exitCode = String(end.exitCode);
      this.title.label = `Sandbox ${shortId(this._options.sessionId)} [exit ${end.exitCode}]`;
    } else {
      this.title.label = `Sandbox ${shortId(this._options.sessionId)} [ended]`;
    }
  }

  private static _count = 0;
  private _options: SandboxTerminal.IOptions;
  private _host: HTMLElement;
  private _term: Terminal;
  private _fit: FitAddon;
  private _opened = false;
  private _connection: ExecConnection | null = null;
}

/** The first 8 characters of a session id, for tab titles. */
export function shortId(id: string): string {
  return id.length > 10 ? id.slice(0, 8) : id;
}
