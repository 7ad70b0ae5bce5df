import { describe, expect, it } from 'vitest';

import { DurationError, parseDuration } from '../src/duration';
import { SpecFormError, buildSpec, defaultForm } from '../src/spec';

describe('parseDuration', () => {
  it.each([
    ['5s', 5],
    ['10m', 600],
    ['1h', 3600],
    ['1h30m', 5400],
    ['1h 30m', 5400],
    ['2d', 172800],
    ['1.5h', 5400],
    ['90', 90],
    ['2.5', 2.5],
    [' 10M ', 600],
    ['1d2h3m4s', 93784]
  ])('reads %j as %d seconds', (text, seconds) => {
    expect(parseDuration(text)).toBe(seconds);
  });

  it.each(['', '   ', 'soon', '10x', '1h30', 'h', '-5m', '0', '0s', '1e3', '5 s s', '1h-30m'])(
    'refuses %j, saying what it takes',
    text => {
      let caught: unknown;
      try {
        parseDuration(text, 'TTL');
      } catch (error) {
        caught = error;
      }
      expect(caught).toBeInstanceOf(DurationError);
      expect((caught as Error).message).toMatch(/^TTL must be/);
    }
  );

  it('names the grammar in its message', () => {
    expect(() => parseDuration('soon', 'TTL')).toThrow('seconds (90) or with units: 90s, 10m, 1h, 1h30m, 2d');
  });
});

describe('the New session form takes a TTL with units', () => {
  const base = defaultForm({ image: '', ttlSeconds: 3600, network: 'egress' });

  it.each([
    ['1h30m', 5400],
    ['10m', 600],
    ['45', 45]
  ])('%j asks for ttl_seconds %d', (ttl, seconds) => {
    expect(buildSpec({ ...base, ttlSeconds: ttl }).ttl_seconds).toBe(seconds);
  });

  it('refuses a bad TTL on its field with the grammar', () => {
    let caught: unknown;
    try {
      buildSpec({ ...base, ttlSeconds: '2 weeks' });
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(SpecFormError);
    expect((caught as SpecFormError).field).toBe('ttlSeconds');
    expect((caught as Error).message).toContain('90s, 10m, 1h, 1h30m');
  });
});
