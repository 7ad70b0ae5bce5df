import { describe, expect, it } from 'vitest';

import { SandboxClient } from '../src/api';
import { DURATION_HINT, DurationError, durationWords, parseDuration } from '../src/duration';
import { SandboxSessions } from '../src/sessions';
import { SpecFormError, buildSpec, defaultForm } from '../src/spec';
import { fakeSettings, json, sessionInfo } from './fakes';

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

describe('durationWords', () => {
  it.each([
    [1800, '30 min'],
    [5400, '1 h 30 min'],
    [45, '45 s'],
    [93784, '1 d 2 h 3 min 4 s']
  ])('says %d seconds as %j', (seconds, words) => {
    expect(durationWords(seconds)).toBe(words);
  });
});

describe('Extend by… takes a typed duration', () => {
  const settle = () => new Promise(resolve => setTimeout(resolve, 0));
  async function answerDialog(text: string): Promise<void> {
    for (let i = 0; i < 200 && !document.querySelector('.jp-Dialog input'); i++) {
      await new Promise(resolve => setTimeout(resolve, 10));
    }
    const input = document.querySelector('.jp-Dialog input') as HTMLInputElement;
    input.value = text;
    (document.querySelector('.jp-Dialog .jp-mod-accept') as HTMLButtonElement).click();
    await settle();
  }

  it('PATCHes the TTL plus 1h30m, after refusing "soon" with the grammar', async () => {
    const session = sessionInfo('sbx-1', { created: 1000, ttl: 900 });
    const { settings, requests } = fakeSettings([
      json(session),
      request => json({ ...session, expires_at: 1000 + JSON.parse(request.body!).ttl_seconds })
    ]);
    const sessions = new SandboxSessions({ client: new SandboxClient(settings), showPanel: () => undefined });
    const errors: string[] = [];
    sessions.notifyError = (message: string) => void errors.push(message);
    const done = sessions.extendTtlBy('sbx-1');
    await answerDialog('soon');
    await answerDialog('1h30m');
    expect(await done).toBe(true);
    expect(errors).toEqual([`The extension must be ${DURATION_HINT}; "soon" is not one.`]);
    const patch = requests.find(r => r.method === 'PATCH')!;
    expect(JSON.parse(patch.body!)).toEqual({ ttl_seconds: 900 + 5400 });
    sessions.model.dispose();
  });
});
