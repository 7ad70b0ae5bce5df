import { describe, expect, it } from 'vitest';

import { SandboxClient } from '../src/api';
import { describeError } from '../src/model';
import { errorFromResponse } from '../src/request';
import { fakeSettings, json } from './fakes';

function answer(status: number, statusText: string, body: string, type = 'application/json'): Response {
  return new Response(body, { status, statusText, headers: { 'Content-Type': type } });
}

describe("a failed request shows the server's message", () => {
  it("shows a typed 503's message on a create, not its status line", async () => {
    const message =
      'the docker provider cannot start sessions: agent binary .../tai-agent-linux-amd64 is missing; ' +
      'reinstall the package (pip install -e .) to build it';
    const { settings } = fakeSettings([
      answer(503, 'Service Unavailable', JSON.stringify({ error: 'SandboxUnavailableError', message }))
    ]);
    const error = await new SandboxClient(settings).createSession({ ttl_seconds: 60 }).catch(e => e);
    expect(error.status).toBe(503);
    expect(error.error).toBe('SandboxUnavailableError');
    expect(describeError(error)).toBe(message);
  });

  it("shows tornado's reason when its message is only the status phrase", async () => {
    const error = await errorFromResponse(
      answer(500, 'Internal Server Error', JSON.stringify({ message: 'Internal Server Error', reason: 'the engine is gone' }))
    );
    expect(describeError(error)).toBe('the engine is gone');
  });

  it('joins a message and a reason that both say something', async () => {
    const error = await errorFromResponse(
      answer(400, 'Bad Request', JSON.stringify({ message: 'ttl_seconds is over the maximum', reason: 'max 3600' }))
    );
    expect(describeError(error)).toBe('ttl_seconds is over the maximum: max 3600');
  });

  it('never shows a bare "Internal Server Error": it points at the server log', async () => {
    for (const response of [
      // jupyter_server's APIHandler for an unhandled exception
      answer(500, 'Internal Server Error', JSON.stringify({ message: 'Unhandled error', reason: null, traceback: '' })),
      answer(500, 'Internal Server Error', JSON.stringify({ message: 'Internal Server Error' })),
      answer(500, 'Internal Server Error', '<html><title>500: Internal Server Error</title><body>500: Internal Server Error</body></html>', 'text/html'),
      answer(500, 'Internal Server Error', '')
    ]) {
      const text = describeError(await errorFromResponse(response));
      expect(text).not.toBe('Internal Server Error');
      expect(text).not.toBe('500 Internal Server Error');
      expect(text).toContain('500 Internal Server Error');
      expect(text).toContain("the Jupyter server's log has the cause");
    }
  });

  it("keeps a proxy page's own words", async () => {
    const error = await errorFromResponse(
      answer(502, 'Bad Gateway', '<html><head><title>upstream connect error</title></head><body>…</body></html>', 'text/html')
    );
    expect(describeError(error)).toBe('502 Bad Gateway: upstream connect error');
  });

  it('reads the message of a JSON error with no error field', async () => {
    const { settings } = fakeSettings([json({ message: 'session sbx-1 is paused' }, 409)]);
    const error = await new SandboxClient(settings).fork('sbx-1').catch(e => e);
    expect(describeError(error)).toBe('session sbx-1 is paused');
  });
});
