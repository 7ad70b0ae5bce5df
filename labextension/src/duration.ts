/**
 * Durations as a person types them where the panel asks for a TTL or a timeout: `90` (seconds),
 * `90s`, `10m`, `1h`, `1.5h`, `2d`, and concatenations such as `1h30m` (or `1h 30m`). The grammar is
 * the magics' and the CLI's: an integer or decimal followed by s, m, h or d; a bare number is seconds.
 */

const UNITS: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86400 };
const PART = /(\d+(?:\.\d*)?|\.\d+)\s*([smhd])/gy;
const BARE = /^(\d+(?:\.\d*)?|\.\d+)$/;

/** What a field of durations takes, for hints and messages. */
export const DURATION_HINT = 'seconds (90) or with units: 90s, 10m, 1h, 1h30m, 2d';

/** A typed duration the grammar refuses: the message says what to type. */
export class DurationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'DurationError';
  }
}

/**
 * Seconds from a typed duration; a DurationError for anything else (empty, negative, zero,
 * an unknown unit, a bare number after a unit).
 */
export function parseDuration(text: string, what = 'a duration'): number {
  const word = text.trim().toLowerCase();
  const refuse = () =>
    new DurationError(`${what} must be ${DURATION_HINT}; "${text.trim()}" is not one.`);
  if (!word) {
    throw refuse();
  }
  let seconds: number;
  if (BARE.test(word)) {
    seconds = Number(word);
  } else {
    seconds = 0;
    PART.lastIndex = 0;
    let at = 0;
    while (at < word.length) {
      PART.lastIndex = at;
      const match = PART.exec(word);
      if (!match) {
        throw refuse();
      }
      seconds += Number(match[1]) * UNITS[match[2]];
      at = PART.lastIndex;
      while (word[at] === ' ') {
        at++;
      }
    }
  }
  if (!Number.isFinite(seconds) || seconds <= 0) {
    throw new DurationError(`${what} must be longer than zero; "${text.trim()}" is not.`);
  }
  return seconds;
}

/** A duration in words for a sentence: `45 s`, `30 min`, `1 h 30 min`, `2 d 3 h`. */
export function durationWords(seconds: number): string {
  const s = Math.round(seconds);
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = s % 60;
  const parts = [
    d ? `${d} d` : '',
    h ? `${h} h` : '',
    m ? `${m} min` : '',
    rest || s === 0 ? `${rest} s` : ''
  ].filter(Boolean);
  return parts.join(' ');
}
