import { describe, expect, it } from 'vitest';

import { ExecConnection, ExecEnd, STDIN_CHUNK, endMessage } from '../src/exec';
import { FakeSocket } from './fakes';

function connect(socket = new FakeSocket()) {
  const connection = new ExecConnection(socket, {
    argv: ['sh', '-i'],
    timeoutSeconds: 600,
    pty: true,
    rows: 30,
    cols: 100
  });
  const out: string[] = [];
  const ends: ExecEnd[] = [];
  connection.output.connect((_, o) => out.push(`${o.stream}:${new TextDecoder().decode(o.data)}`));
  connection.ended.connect((_, e) => ends.push(e));
  return { socket, connection, out, ends };
}

describe('ExecConnection', () => {
  it('sends start first, with the pty size, and uses binary frames', () => {
    const { socket } = connect();
    expect(socket.binaryType).toBe('arraybuffer');
    socket.open();
    expect(socket.controls()).toEqual([
      { type: 'start', argv: ['sh', '-i'], timeout_seconds: 600, pty: true, rows: 30, cols: 100 }
    ]);
  });

  it('holds input until started, then sends it as binary stdin', () => {
    const { socket, connection } = connect();
    connection.write('early\r');
    socket.open();
    expect(socket.stdin()).toBe('');
    socket.text({ type: 'started' });
    expect(socket.stdin()).toBe('early\r');
    connection.write('\x03'); // Ctrl-C goes through the pty as a byte
    expect(socket.stdin()).toBe('early\r\x03');
    expect(connection.phase).toBe('running');
  });

  it('splits a large paste into frames of at most STDIN_CHUNK bytes', () => {
    const { socket, connection } = connect();
    socket.open();
    socket.text({ type: 'started' });
    const big = 'x'.repeat(STDIN_CHUNK * 2 + 10);
    connection.write(big);
    const frames = socket.sent.filter(m => typeof m !== 'string') as Uint8Array[];
    expect(frames.map(f => f.length)).toEqual([STDIN_CHUNK, STDIN_CHUNK, 10]);
    expect(socket.stdin()).toBe(big);
  });

  it('routes stdout and stderr by the first byte', () => {
    const { socket, out } = connect();
    socket.open();
    socket.text({ type: 'started' });
    socket.binary(1, 'hello-42\r\n');
    socket.binary(2, 'oops');
    expect(out).toEqual(['stdout:hello-42\r\n', 'stderr:oops']);
  });

  it('sends resize while running and ignores nonsense sizes', () => {
    const { socket, connection } = connect();
    socket.open();
    socket.text({ type: 'started' });
    connection.resize(40, 120);
    connection.resize(0, 10);
    expect(socket.controls().slice(1)).toEqual([{ type: 'resize', rows: 40, cols: 120 }]);
  });

  it('ends once with the exit status', () => {
    const { socket, connection, ends } = connect();
    socket.open();
    socket.text({ type: 'started' });
    socket.text({ type: 'exit', exit_code: 3 });
    socket.drop(1000);
    expect(ends).toEqual([{ kind: 'exit', exitCode: 3 }]);
    expect(endMessage(ends[0])).toBe('[process exited with status 3]');
    connection.write('late'); // after the end: nothing is sent
    expect(socket.stdin()).toBe('');
  });

  it('reports a server error and a refused request', () => {
    const { socket, connection, ends } = connect();
    const refused: string[] = [];
    connection.rejected.connect((_, r) => refused.push(r.request));
    socket.open();
    socket.text({ type: 'started' });
    socket.text({ type: 'rejected', request: 'resize', error: 'X', message: 'no pty' });
    socket.text({ type: 'error', error: 'SandboxExecTimeoutError', message: 'deadline' });
    expect(refused).toEqual(['resize']);
    expect(ends).toEqual([{ kind: 'error', error: 'SandboxExecTimeoutError', message: 'deadline' }]);
  });

  it('explains a socket that never opened (session gone)', () => {
    const { socket, ends } = connect();
    socket.drop(1006);
    expect(ends[0].kind).toBe('error');
    expect(ends[0].kind === 'error' && ends[0].message).toContain('could not connect');
  });

  it('kills the command and closes on dispose (closing the tab)', () => {
    const { socket, connection } = connect();
    socket.open();
    socket.text({ type: 'started' });
    connection.dispose();
    expect(socket.controls().pop()).toEqual({ type: 'kill' });
    expect(socket.closed).toBe(1000);
  });
});

describe('ExecConnection: attach and offsets', () => {
  it('counts output offsets of both streams from the exec id it was given', () => {
    const { socket, connection } = connect();
    socket.open();
    socket.text({ type: 'started', exec_id: 'exe-1' });
    expect(connection.execId).toBe('exe-1');
    socket.binary(1, 'abc');
    socket.binary(2, 'de');
    expect(connection.offset).toBe(5);
  });

  it('attaches by exec id from an offset, repaints, then resizes the pty', () => {
    const socket = new FakeSocket();
    const connection = new ExecConnection(socket, {
      attach: { execId: 'exe-1', offset: 0 },
      rows: 40,
      cols: 120
    });
    const attached: any[] = [];
    const out: string[] = [];
    connection.attached.connect((_, a) => attached.push(a));
    connection.output.connect((_, o) => out.push(new TextDecoder().decode(o.data)));
    connection.write('early');
    socket.open();
    expect(socket.controls()).toEqual([{ type: 'attach', exec_id: 'exe-1', offset: 0 }]);
    socket.text({ type: 'attached', exec_id: 'exe-1', offset: 100 });
    socket.binary(1, 'tail');
    expect(attached).toEqual([{ execId: 'exe-1', offset: 100, requested: 0 }]);
    expect(socket.controls().slice(1)).toEqual([{ type: 'resize', rows: 40, cols: 120 }]);
    expect(socket.stdin()).toBe('early');
    expect(out).toEqual(['tail']);
    expect(connection.offset).toBe(104);
    expect(connection.phase).toBe('running');
  });

  it('ends with the server error when the command is gone, and "Detached" when taken over', () => {
    const a = new FakeSocket();
    const gone = new ExecConnection(a, { attach: { execId: 'exe-x', offset: 0 } });
    const ends: ExecEnd[] = [];
    gone.ended.connect((_, e) => ends.push(e));
    a.open();
    a.text({ type: 'error', error: 'SandboxNotFoundError', message: "no running command 'exe-x'" });
    expect(ends).toEqual([
      { kind: 'error', error: 'SandboxNotFoundError', message: "no running command 'exe-x'" }
    ]);

    const { socket, ends: taken } = connect();
    socket.open();
    socket.text({ type: 'started', exec_id: 'exe-2' });
    socket.text({ type: 'detached', message: 'another client attached to this command' });
    expect(taken[0]).toMatchObject({ kind: 'error', error: 'Detached' });
  });
});
