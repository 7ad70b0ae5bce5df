import { describe, expect, it } from 'vitest';

import { endMessage } from '../src/exec';
import { terminalTimeout } from '../src/terminal';

describe('terminalTimeout', () => {
  it("asks for the session's TTL left when it is under the operator's maximum", () => {
    expect(terminalTimeout(1800.2, 21600)).toBe(1801);
  });

  it("asks for the operator's maximum on a session that lives longer (a %%sandbox session's 8 h)", () => {
    expect(terminalTimeout(28761, 21600)).toBe(21600);
  });

  it('asks for the TTL left when the server names no maximum', () => {
    expect(terminalTimeout(28761, 0)).toBe(28761);
    expect(terminalTimeout(28761, null)).toBe(28761);
  });

  it('asks for a minute at least on a session about to end, never past the maximum', () => {
    expect(terminalTimeout(3, 21600)).toBe(60);
    expect(terminalTimeout(3, 30)).toBe(30);
  });
});

describe('endMessage of an exit with a reason', () => {
  it("says the server's reason after the status (an out-of-memory kill)", () => {
    const reason = "killed: out of memory (the session's limit is 32 MiB)";
    expect(endMessage({ kind: 'exit', exitCode: 137, reason })).toBe(
      `[process exited with status 137: ${reason}]`
    );
    expect(endMessage({ kind: 'exit', exitCode: 137 })).toBe('[process exited with status 137]');
  });
});
