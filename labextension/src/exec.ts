/**
 * The client side of the exec websocket (jupyter_tai_sandbox/ws.py):
 * a start message, stdin as binary frames, resize/kill control messages;
 * output as binary frames tagged with the stream id, then one exit or error.
 */
import { ISignal, Signal } from '@lumino/signaling';

export const STDOUT = 1;
export const STDERR = 2;

/** Largest binary frame sent for stdin (a big paste goes out in several). */
export const STDIN_CHUNK = 64 * 1024;

/** The part of a browser WebSocket the connection uses (a fake one in tests). */
export interface IExecSocket {
  binaryType: string;
  readyState: number;
  onopen: ((ev: any) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: any) => void) | null;
  send(data: string | ArrayBufferLike | ArrayBufferView): void;
  close(code?: number, reason?: string): void;
}

export interface IStartOptions {
  argv: string[];
  timeoutSeconds: number;
  pty: boolean;
  rows?: number;
  cols?: number;
  env?: Record<string, string>;
  cwd?: string;
}

/** Attach to a command started earlier (by its exec id), replaying its output from `offset`. */
export interface IAttachOptions {
  attach: { execId: string; offset: number };
  /** The terminal's size, sent once attached (a pty keeps the size it had). */
  rows?: number;
  cols?: number;
  pty?: boolean;
}

export function isAttach(options: IStartOptions | IAttachOptions): options is IAttachOptions {
  return (options as IAttachOptions).attach !== undefined;
}

/** How the command ended: an exit status, or an error (the connection's or the server's). */
export type ExecEnd =
  | { kind: 'exit'; exitCode: number; reason?: string }
  | { kind: 'error'; error: string; message: string };

export interface IOutput {
  stream: 'stdout' | 'stderr';
  data: Uint8Array;
}

export type ExecPhase = 'connecting' | 'running' | 'ended';

const OPEN = 1;

/**
 * One interactive command over one websocket: started here, or attached to by
 * its exec id. `offset` counts the output bytes (both streams) seen so far, so
 * a lost connection can attach again from where it stopped.
 */
export class ExecConnection {
  constructor(socket: IExecSocket, start: IStartOptions | IAttachOptions) {
    this._socket = socket;
    this._start = start;
    socket.binaryType = 'arraybuffer';
    socket.onopen = () => this._onOpen();
    socket.onmessage = ev => this._onMessage(ev.data);
    socket.onclose = ev => this._onClose(ev.code, ev.reason);
    socket.onerror = () => {
      // onclose follows with the details
    };
    if (socket.readyState === OPEN) {
      this._onOpen();
    }
  }

  get phase(): ExecPhase {
    return this._phase;
  }

  get end(): ExecEnd | null {
    return this._end;
  }

  /** The command's exec id, once the server has said it ("started" or "attached"). */
  get execId(): string | null {
    return this._execId;
  }

  /** The absolute output offset after the last byte received. */
  get offset(): number {
    return this._offset;
  }

  /**
   * Fires once attached, with the first offset the server replays from: more
   * than the offset asked for when the ring no longer holds the start.
   */
  get attached(): ISignal<this, { execId: string; offset: number; requested: number }> {
    return this._attached;
  }

  get output(): ISignal<this, IOutput> {
    return this._output;
  }

  get started(): ISignal<this, void> {
    return this._started;
  }

  /** Fires once, with how the command ended. */
  get ended(): ISignal<this, ExecEnd> {
    return this._ended;
  }

  /** A request the server refused while the command runs on (e.g. a write after exit). */
  get rejected(): ISignal<this, { request: string; message: string }> {
    return this._rejected;
  }

  /** Send input: text is UTF-8 encoded; a large input goes out in several frames. */
  write(data: string | Uint8Array): void {
    if (this._phase === 'ended') {
      return;
    }
    const bytes = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    for (let offset = 0; offset < bytes.length; offset += STDIN_CHUNK) {
      this._sendOrQueue(bytes.slice(offset, offset + STDIN_CHUNK));
    }
  }

  resize(rows: number, cols: number): void {
    if (this._phase === 'ended' || rows < 1 || cols < 1) {
      return;
    }
    this._start = { ...this._start, rows, cols };
    if (this._phase === 'running' && this._start.pty !== false) {
      this._sendJSON({ type: 'resize', rows, cols });
    }
  }

  closeStdin(): void {
    this._control({ type: 'close_stdin' });
  }

  /** Stop the command (the server still sends its exit status). */
  kill(): void {
    this._control({ type: 'kill' });
  }

  /** Kill the command if it still runs, and close the socket. */
  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    if (this._phase !== 'ended' && this._socket.readyState === OPEN) {
      this._sendJSON({ type: 'kill' });
    }
    this._finish({ kind: 'error', error: 'Closed', message: 'closed by the user' });
    try {
      this._socket.close(1000);
    } catch {
      // already closed
    }
    Signal.clearData(this);
  }

  private _control(message: Record<string, unknown>): void {
    if (this._phase === 'running') {
      this._sendJSON(message);
    } else if (this._phase === 'connecting') {
      this._queue.push(JSON.stringify(message));
    }
  }

  private _sendOrQueue(bytes: Uint8Array): void {
    if (this._phase === 'running') {
      this._socket.send(bytes);
    } else {
      this._queue.push(bytes);
    }
  }

  private _sendJSON(message: Record<string, unknown>): void {
    this._socket.send(JSON.stringify(message));
  }

  private _onOpen(): void {
    if (this._opened) {
      return;
    }
    this._opened = true;
    if (isAttach(this._start)) {
      const { execId, offset } = this._start.attach;
      this._sendJSON({ type: 'attach', exec_id: execId, offset });
      return;
    }
    const s = this._start;
    const message: Record<string, unknown> = {
      type: 'start',
      argv: s.argv,
      timeout_seconds: s.timeoutSeconds,
      pty: s.pty
    };
    if (s.pty && s.rows && s.cols) {
      message.rows = s.rows;
      message.cols = s.cols;
    }
    if (s.env) {
      message.env = s.env;
    }
    if (s.cwd) {
      message.cwd = s.cwd;
    }
    this._sendJSON(message);
  }

  private _onMessage(data: unknown): void {
    if (typeof data === 'string') {
      let message: any;
      try {
        message = JSON.parse(data);
      } catch {
        return;
      }
      this._onControl(message);
      return;
    }
    const bytes =
      data instanceof ArrayBuffer
        ? new Uint8Array(data)
        : ArrayBuffer.isView(data)
          ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
          : null;
    if (!bytes || bytes.length === 0) {
      return;
    }
    const stream = bytes[0] === STDERR ? 'stderr' : 'stdout';
    this._offset += bytes.length - 1;
    this._output.emit({ stream, data: bytes.subarray(1) });
  }

  private _onControl(message: any): void {
    switch (message?.type) {
      case 'started': {
        this._execId = typeof message.exec_id === 'string' ? message.exec_id : null;
        this._offset = 0;
        this._run();
        this._started.emit();
        break;
      }
      case 'attached': {
        const requested = isAttach(this._start) ? this._start.attach.offset : 0;
        this._execId = String(message.exec_id);
        this._offset = Number(message.offset) || 0;
        this._run();
        const { rows, cols } = this._start;
        if (this._start.pty !== false && rows && cols) {
          this._sendJSON({ type: 'resize', rows, cols });
        }
        this._attached.emit({ execId: this._execId, offset: this._offset, requested });
        this._started.emit();
        break;
      }
      case 'detached':
        this._finish({
          kind: 'error',
          error: 'Detached',
          message: String(message.message ?? 'another client attached to this command')
        });
        break;
      case 'exit':
        this._finish({
          kind: 'exit',
          exitCode: Number(message.exit_code),
          // why, where the status alone does not say: "killed: out of memory (the session's limit is N MiB)"
          ...(typeof message.reason === 'string' ? { reason: message.reason } : {})
        });
        break;
      case 'error':
        this._finish({
          kind: 'error',
          error: String(message.error ?? 'Error'),
          message: String(message.message ?? 'the command failed')
        });
        break;
      case 'rejected':
        this._rejected.emit({
          request: String(message.request ?? ''),
          message: String(message.message ?? '')
        });
        break;
      default:
        break;
    }
  }

  private _run(): void {
    this._phase = 'running';
    const queued = this._queue;
    this._queue = [];
    for (const item of queued) {
      this._socket.send(item);
    }
  }

  /** Close the socket without killing the command (it runs on, detached, for the grace time). */
  detach(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._finish({ kind: 'error', error: 'Detached', message: 'detached by the user' });
    try {
      this._socket.close(1000);
    } catch {
      // already closed
    }
    Signal.clearData(this);
  }

  private _onClose(code: number, reason: string): void {
    this._finish({
      kind: 'error',
      error: 'ConnectionClosed',
      message:
        this._phase === 'connecting' && !this._opened
          ? `could not connect to the session (code ${code}${reason ? `: ${reason}` : ''}); is it still alive?`
          : `the connection closed before the command ended (code ${code}${reason ? `: ${reason}` : ''})`
    });
  }

  private _finish(end: ExecEnd): void {
    if (this._phase === 'ended') {
      return;
    }
    this._phase = 'ended';
    this._end = end;
    this._queue = [];
    this._ended.emit(end);
  }

  private _socket: IExecSocket;
  private _start: IStartOptions | IAttachOptions;
  private _execId: string | null = null;
  private _offset = 0;
  private _attached = new Signal<this, { execId: string; offset: number; requested: number }>(this);
  private _phase: ExecPhase = 'connecting';
  private _opened = false;
  private _disposed = false;
  private _end: ExecEnd | null = null;
  private _queue: (string | Uint8Array)[] = [];
  private _output = new Signal<this, IOutput>(this);
  private _started = new Signal<this, void>(this);
  private _ended = new Signal<this, ExecEnd>(this);
  private _rejected = new Signal<this, { request: string; message: string }>(this);
}

/** The status line written into the terminal when the command ends. */
export function endMessage(end: ExecEnd): string {
  if (end.kind === 'exit') {
    return `[process exited with status ${end.exitCode}${end.reason ? `: ${end.reason}` : ''}]`;
  }
  return `[${end.error}: ${end.message}]`;
}
