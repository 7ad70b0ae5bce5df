import { describe, expect, it } from 'vitest';

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
