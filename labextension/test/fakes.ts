/** Test doubles: ServerConnection settings over a scripted fetch, and a fake websocket. */
import { ServerConnection } from '@jupyterlab/services';

import { ISessionInfo } from '../src/api';
import { IExecSocket } from '../src/exec';

export interface IRecorded {
  url: string;
  method: string;
  headers: Headers;
  body: string | null;
}

export type Reply = Response | Error | ((request: IRecorded) => Response | Error);

/** Settings whose fetch answers from `replies`, in order, recording each request. */
export function fakeSettings(replies: Reply[], token = 'secret-token') {
  const requests: IRecorded[] = [];
  const fetchImpl = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const request = input instanceof Request ? input : new Request(String(input), init);
    const recorded: IRecorded = {
      // makeRequest adds a cache-busting `?<timestamp>` to GETs
      url: request.url.replace(/([?&])\d{10,}$/, '').replace(/\?$/, ''),
      method: request.method,
      headers: request.headers,
      body: request.method === 'GET' || request.method === 'HEAD' ? null : await request.text()
    };
    requests.push(recorded);
    let reply = replies.shift();
    if (reply === undefined) {
      throw new Error(`unexpected request ${recorded.method} ${recorded.url}`);
    }
    if (typeof reply === 'function') {
      reply = reply(recorded);
    }
    if (reply instanceof Error) {
      throw reply;
    }
    return reply;
  };
  const settings = ServerConnection.makeSettings({
    baseUrl: 'http://lab.test/base/',
    wsUrl: 'ws://lab.test/base/',
    token,
    appendToken: true,
    fetch: fetchImpl as any,
    Request: Request as any,
    Headers: Headers as any
  });
  return { settings, requests };
}

export function json(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'Content-Type': 'application/json' }
  });
}

export class FakeSocket implements IExecSocket {
  binaryType = 'blob';
  readyState = 0;
  sent: (string | Uint8Array)[] = [];
  closed: number | null = null;
  onopen: ((ev: any) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: any) => void) | null = null;

  send(data: string | ArrayBufferLike | ArrayBufferView): void {
    if (this.readyState !== 1) {
      throw new Error('send on a socket that is not open');
    }
    this.sent.push(typeof data === 'string' ? data : new Uint8Array(data as ArrayBuffer));
  }

  close(code = 1000): void {
    this.closed = code;
    this.readyState = 3;
  }

  // server side
  open(): void {
    this.readyState = 1;
    this.onopen?.({});
  }
  text(message: unknown): void {
    this.onmessage?.({ data: JSON.stringify(message) });
  }
  binary(stream: number, text: string): void {
    const body = new TextEncoder().encode(text);
    const frame = new Uint8Array(body.length + 1);
    frame[0] = stream;
    frame.set(body, 1);
    this.onmessage?.({ data: frame.buffer });
  }
  drop(code = 1006, reason = ''): void {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
  /** The JSON control messages sent so far. */
  controls(): any[] {
    return this.sent.filter((m): m is string => typeof m === 'string').map(m => JSON.parse(m));
  }
  /** The stdin bytes sent so far, as text. */
  stdin(): string {
    const parts = this.sent.filter((m): m is Uint8Array => typeof m !== 'string');
    return parts.map(p => new TextDecoder().decode(p)).join('');
  }
}

/** A session row as the server lists it (local provider, ephemeral), `ttl` seconds left at `created`. */
export function sessionInfo(id: string, { consumer = 'me', created = 1000, ttl = 3600 } = {}): ISessionInfo {
  return {
    id,
    kind: 'local',
    consumer,
    image: null,
    isolation: 'none',
    network: 'egress',
    durability: 'ephemeral',
    workspace_key: null,
    workspace: `/w/${id}`,
    created_at: created,
    expires_at: created + ttl,
    seconds_left: ttl,
    spec: {}
  };
}

/** GET /status of a server on the local provider. */
export const LOCAL_STATUS = {
  kind: 'local',
  policy: { isolation: 'none', egress: 'egress', durable: true, scrub_transcript: false, credentials: {} }
} as const;
