/**
 * A main-area tab with an xterm.js terminal attached to a session's exec
 * websocket, on a pty. Closing the tab kills the command; a page reload only
 * detaches it: the restored tab attaches again by exec id and repaints from
 * the server's output ring. A state line says what the tab is showing.
 */
import { ServerConnection } from '@jupyterlab/services';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';
import { FitAddon } from '@xterm/addon-fit';
import { Terminal } from '@xterm/xterm';
import '@xterm/xterm/css/xterm.css';

import { ISignal, Signal } from '@lumino/signaling';

import { IStatus, SandboxClient } from './api';
import {
  ExecConnection,
  ExecEnd,
  IAttachOptions,
  IStartOptions,
  endMessage,
  isAttach
} from './exec';
import { SandboxAPIError } from './request';

export namespace SandboxTerminal {
  export interface IOptions {
    client: SandboxClient;
    sessionId: string;
    /** The command a new terminal starts (not used when `execId` is given). */
    argv?: string[];
    /**
     * The command's deadline. Left out, each new shell asks for the session's TTL left, at most the
     * operator's maximum (the status route's `policy.max_timeout_seconds`): see `terminalTimeout`.
     */
    timeoutSeconds?: number;
    /** Attach to this running command instead of starting one (a restored tab). */
    execId?: string;
  }
}

/** What the state line shows. */
export type TerminalPhase = 'connecting' | 'running' | 'lost' | 'ended' | 'gone' | 'detached';

/** The server's error for a command whose session went under it (reaped at its TTL, destroyed). */
const SESSION_GONE = 'SandboxSessionGoneError';

/** The shortest deadline a terminal asks for, even on a session about to end. */
const MIN_TERMINAL_SECONDS = 60;

/**
 * A new shell's deadline: as long as its session lives (`secondsLeft`), never over the operator's
 * maximum (`maxTimeoutSeconds`; 0 or absent: none), which the server refuses rather than clamps.
 */
export function terminalTimeout(secondsLeft: number, maxTimeoutSeconds?: number | null): number {
  const wanted = Math.max(MIN_TERMINAL_SECONDS, Math.ceil(secondsLeft));
  return maxTimeoutSeconds && maxTimeoutSeconds > 0 ? Math.min(wanted, Math.floor(maxTimeoutSeconds)) : wanted;
}

/** Tries to attach again after a lost connection, with these pauses (ms). */
const REATTACH_DELAYS = [250, 1000, 2000, 4000, 8000];

export class SandboxTerminal extends Widget {
  constructor(options: SandboxTerminal.IOptions) {
    super();
    this._options = options;
    this._execId = options.execId ?? null;
    this.addClass('jp-TaiSandbox-terminal');
    this.node.dataset.sessionId = options.sessionId;
    if (this._execId) {
      this.node.dataset.execId = this._execId;
    }
    this.id = `tai-sandbox-terminal-${options.sessionId}-${++SandboxTerminal._count}-${Date.now().toString(36)}`;
    this.title.label = `Sandbox ${shortId(options.sessionId)}`;
    this.title.caption = `Terminal in sandbox session ${options.sessionId}`;
    this.title.closable = true;

    this._state = document.createElement('div');
    this._state.className = 'jp-TaiSandbox-terminalState';
    this._state.setAttribute('role', 'status');
    this._stateText = document.createElement('span');
    this._stateText.className = 'jp-TaiSandbox-terminalStateText';
    this._stateAction = document.createElement('button');
    this._stateAction.className = 'jp-Button jp-mod-styled jp-mod-small jp-TaiSandbox-button jp-TaiSandbox-stateAction';
    this._stateAction.hidden = true;
    this._stateAction.addEventListener('click', () => this._onStateAction());
    this._state.append(this._stateText, this._stateAction);

    this._host = document.createElement('div');
    this._host.className = 'jp-TaiSandbox-terminalHost';
    this.node.append(this._state, this._host);

    this._term = new Terminal({
      cursorBlink: true,
      fontFamily: 'Menlo, Consolas, "DejaVu Sans Mono", monospace',
      fontSize: 13,
      scrollback: 5000,
      theme: { background: '#1e1e1e', foreground: '#e6e6e6' }
    });
    this._fit = new FitAddon();
    this._term.loadAddon(this._fit);
    this._term.onData(data => this._connection?.write(data));
    this._term.onBinary(data => {
      const bytes = Uint8Array.from(data, c => c.charCodeAt(0) & 0xff);
      this._connection?.write(bytes);
    });
    this._term.onResize(({ rows, cols }) => {
      this._showSize();
      this._connection?.resize(rows, cols);
    });
    this._setPhase('connecting', 'Connecting…');
  }

  get sessionId(): string {
    return this._options.sessionId;
  }

  /** The running command's exec id (what a restored tab attaches to). */
  get execId(): string | null {
    return this._execId;
  }

  /** Fires when the exec id becomes known or changes (a new command in this tab). */
  get execChanged(): ISignal<this, string | null> {
    return this._execChanged;
  }

  get phase(): TerminalPhase {
    return this._phase;
  }

  /** How the command ended, once it has. */
  get end(): ExecEnd | null {
    return this._end;
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (!this._opened) {
      this._opened = true;
      this._term.open(this._host);
      this._fitNow();
      if (this._execId) {
        void this._restore(this._execId);
      } else {
        this._start();
      }
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
    window.clearTimeout(this._retryTimer);
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

  /** A new command in this tab. */
  private async _start(): Promise<void> {
    const { argv = ['sh', '-i'] } = this._options;
    this.title.caption = `Terminal in sandbox session ${this.sessionId} (${argv.join(' ')})`;
    this._end = null;
    this._setExecId(null);
    this._setPhase('connecting', 'Connecting…');
    const timeoutSeconds = await this._deadline();
    if (timeoutSeconds === null || this.isDisposed) {
      return; // the session is gone: the last shell's screen stays, with the tab's message under it
    }
    this._term.reset();
    this._connect({
      argv,
      timeoutSeconds,
      pty: true,
      rows: this._term.rows,
      cols: this._term.cols
    });
  }

  /**
   * The deadline of a new shell: the one given, else the session's TTL left at most the operator's
   * maximum, asked now (so "Start a new shell" on an older session still fits). Null when the session
   * is gone (the tab says so).
   */
  private async _deadline(): Promise<number | null> {
    if (this._options.timeoutSeconds !== undefined) {
      return this._options.timeoutSeconds;
    }
    const { client, sessionId } = this._options;
    const status = client.status().then(
      st => maxTimeoutOf(st),
      () => null // the server's check still applies: it names the maximum if we ask past it
    );
    let secondsLeft = 3600;
    try {
      // the list, not the session's route: that one measures its usage too
      const listed = (await client.listSessions()).find(s => s.id === sessionId);
      secondsLeft = listed ? listed.seconds_left : (await client.getSession(sessionId)).seconds_left;
    } catch (error) {
      if (error instanceof SandboxAPIError && error.status === 404) {
        this._sessionGone(error.message || `Session ${sessionId} is gone (destroyed or reaped).`);
        return null;
      }
    }
    return terminalTimeout(secondsLeft, await status);
  }

  /** True (and the tab says why) when the session answers 404: reaped, destroyed, or unknown. */
  private async _sessionIsGone(): Promise<boolean> {
    try {
      await this._options.client.getSession(this.sessionId);
      return false;
    } catch (error) {
      if (error instanceof SandboxAPIError && error.status === 404) {
        this._sessionGone(
          error.error === SESSION_GONE
            ? error.message
            : `Session ${this.sessionId} is gone (destroyed or reaped): its command ${this._execId ?? ''} with it.`
        );
        return true;
      }
      return false; // the server may be restarting: the reattach tries
    }
  }

  /** A restored tab: attach from offset 0 (repaint from the ring) when the command is still there. */
  private async _restore(execId: string): Promise<void> {
    this._setPhase('connecting', `Reattaching to ${execId}…`);
    let known = true;
    try {
      const execs = await this._options.client.listExecs(this.sessionId);
      known = execs.some(e => e.id === execId);
    } catch (error) {
      if (error instanceof SandboxAPIError && error.status === 404) {
        if (error.error === SESSION_GONE) {
          this._sessionGone(`${error.message}: its command ${execId} with it.`);
        } else {
          this._gone(`Session ${this.sessionId} is gone (destroyed or reaped): its command ${execId} with it.`);
        }
        return;
      }
      // the server may be restarting: try the websocket anyway
    }
    if (this.isDisposed) {
      return;
    }
    if (!known) {
      this._gone(
        `Command ${execId} has ended or is gone (404): it ran past its grace time while detached, ` +
          'or ended and was forgotten. Its output is not kept.'
      );
      return;
    }
    this._attach(execId, 0);
  }

  private _attach(execId: string, offset: number): void {
    this._connect({
      attach: { execId, offset },
      pty: true,
      rows: this._term.rows,
      cols: this._term.cols
    });
  }

  private _connect(start: IStartOptions | IAttachOptions): void {
    const { client, sessionId } = this._options;
    const settings: ServerConnection.ISettings = client.serverSettings;
    const socket = new settings.WebSocket(client.execUrl(sessionId));
    const connection = new ExecConnection(socket as any, start);
    const attaching = isAttach(start);
    this._connection = connection;

    connection.started.connect(() => {
      this._retries = 0;
      if (connection.execId) {
        this._setExecId(connection.execId);
      }
      const id = connection.execId ?? '';
      this._setPhase(
        'running',
        attaching ? `Reattached · ${id} (repainted from the server's output ring)` : `Running · ${id}`
      );
    });
    connection.attached.connect((_, { offset, requested }) => {
      if (offset > requested) {
        this._term.write(
          `\r\n\x1b[33m[${offset - requested} bytes of earlier output are no longer kept]\x1b[0m\r\n`
        );
      }
    });
    connection.output.connect((_, { data }) => {
      this._term.write(data);
    });
    connection.rejected.connect((_, { request, message }) => {
      this._term.write(`\r\n\x1b[33m[${request} refused: ${message}]\x1b[0m\r\n`);
    });
    connection.ended.connect((_, end) => {
      if (this._connection === connection) {
        this._onEnded(end, connection, attaching);
      }
    });
    this._showSize();
  }

  /** The pty size, readable by people (caption) and tests (data attributes). */
  private _showSize(): void {
    this.node.dataset.rows = String(this._term.rows);
    this.node.dataset.cols = String(this._term.cols);
  }

  private _setExecId(execId: string | null): void {
    if (execId === this._execId) {
      return;
    }
    this._execId = execId;
    if (execId) {
      this.node.dataset.execId = execId;
    } else {
      delete this.node.dataset.execId;
    }
    this._execChanged.emit(execId);
  }

  private _setPhase(phase: TerminalPhase, text: string, action: string | null = null): void {
    this._phase = phase;
    this.node.dataset.phase = phase;
    this._state.dataset.phase = phase;
    this._stateText.textContent = text;
    this._stateAction.hidden = !action;
    // jp-Button's display rule outranks the hidden attribute: an empty button would still show
    this._stateAction.style.display = action ? '' : 'none';
    this._stateAction.textContent = action ?? '';
  }

  /**
   * The session itself is gone (reaped at its TTL, or destroyed): said in the terminal and its state line,
   * with nothing to start a new shell in.
   */
  private _sessionGone(message: string): void {
    this._setPhase('gone', message);
    this.node.dataset.sessionGone = 'true';
    this.title.label = `Sandbox ${shortId(this.sessionId)} [session gone]`;
    this._term.write(`\r\n\x1b[1;33m[${message}]\x1b[0m\r\n`);
  }

  private _gone(message: string): void {
    this._setPhase('gone', message, 'Start a new shell');
    this.title.label = `Sandbox ${shortId(this.sessionId)} [gone]`;
    this._term.write(`\r\n\x1b[1;33m[${message}]\x1b[0m\r\n`);
  }

  private _onStateAction(): void {
    if (this._phase === 'lost' && this._execId) {
      this._retries = 0;
      this._attach(this._execId, this._lostOffset);
      this._setPhase('connecting', `Reattaching to ${this._execId}…`);
    } else if (this._phase === 'detached' && this._execId) {
      this._term.reset();
      this._attach(this._execId, 0);
      this._setPhase('connecting', `Reattaching to ${this._execId}…`);
    } else if (this._phase === 'ended' || this._phase === 'gone') {
      this.title.label = `Sandbox ${shortId(this.sessionId)}`;
      delete this.node.dataset.exitCode;
      this._start();
    }
  }

  private _onEnded(end: ExecEnd, connection: ExecConnection, attaching: boolean): void {
    if (this.isDisposed) {
      return;
    }
    const execId = connection.execId ?? this._execId;
    if (end.kind === 'error' && end.error === SESSION_GONE) {
      this._end = end;
      this._sessionGone(end.message);
      return;
    }
    if (end.kind === 'error' && end.error === 'ConnectionClosed' && execId) {
      // the socket dropped while the command runs: it is detached, attach again from where we were
      this._lostOffset = connection.offset;
      if (this._retries >= REATTACH_DELAYS.length) {
        this._setPhase(
          'lost',
          `Connection lost: ${end.message}. The command runs on for the server's grace time.`,
          'Reattach'
        );
        return;
      }
      {
        const delay = REATTACH_DELAYS[this._retries++];
        this._setPhase('lost', `Connection lost; reattaching to ${execId}…`);
        const offset = connection.offset;
        this._retryTimer = window.setTimeout(async () => {
          // a session gone meanwhile refuses the socket before it opens (1006): ask the REST route why
          if (!this.isDisposed && !(await this._sessionIsGone()) && !this.isDisposed) {
            this._attach(execId, offset);
          }
        }, delay);
        return;
      }
    }
    if (end.kind === 'error' && end.error === 'Detached') {
      this._setPhase('detached', `Another window attached to ${execId}; this tab stopped showing it.`, 'Attach here');
      return;
    }
    if (end.kind === 'error' && end.error === 'SandboxNotFoundError' && (attaching || !execId)) {
      this._gone(`Command ${execId ?? ''} has ended or is gone (404): ${end.message}`);
      return;
    }
    this._end = end;
    const color = end.kind === 'exit' && end.exitCode === 0 ? '32' : '31';
    this._term.write(`\r\n\x1b[1;${color}m${endMessage(end)}\x1b[0m\r\n`);
    if (end.kind === 'exit') {
      this.node.dataset.exitCode = String(end.exitCode);
      this.title.label = `Sandbox ${shortId(this.sessionId)} [exit ${end.exitCode}]`;
      const why = end.reason ? ` (${end.reason})` : '';
      this._setPhase('ended', `The command has ended: exit status ${end.exitCode}${why}.`, 'Start a new shell');
    } else {
      this.title.label = `Sandbox ${shortId(this.sessionId)} [ended]`;
      this._setPhase('ended', `The command has ended: ${end.error}: ${end.message}`, 'Start a new shell');
    }
  }

  private static _count = 0;
  private _options: SandboxTerminal.IOptions;
  private _state: HTMLElement;
  private _stateText: HTMLElement;
  private _stateAction: HTMLButtonElement;
  private _host: HTMLElement;
  private _term: Terminal;
  private _fit: FitAddon;
  private _opened = false;
  private _phase: TerminalPhase = 'connecting';
  private _execId: string | null;
  private _end: ExecEnd | null = null;
  private _retries = 0;
  private _retryTimer = 0;
  private _lostOffset = 0;
  private _connection: ExecConnection | null = null;
  private _execChanged = new Signal<this, string | null>(this);
}

function maxTimeoutOf(status: IStatus): number | null {
  const policy = status.policy as { max_timeout_seconds?: number } | undefined;
  return policy?.max_timeout_seconds ?? null;
}

/** The first 8 characters of a session id, for tab titles. */
export function shortId(id: string): string {
  return id.length > 10 ? id.slice(0, 8) : id;
}
