/**
 * The sessions' recent resource use (GET usage: the server's usage history, one request for all of
 * them) as sparklines: pure functions from samples to an SVG path, its tooltip, and the words for what a
 * session serves. Nothing here touches the DOM or the network.
 */
import { IKernelUser, ISessionUsage, formatBytes } from './kernels';

/** One sample of a session (UsageSample in api.yaml); a field the provider cannot measure is null. */
export interface IUsageSample {
  /** When it was measured, epoch seconds. */
  time: number;
  /** The fraction of one core used since the sample before (null for the first, or where not measured). */
  cpu: number | null;
  cpu_seconds?: number | null;
  memory_bytes: number | null;
  memory_limit_bytes?: number | null;
  disk_bytes: number | null;
  disk_partial?: boolean | null;
}

/** What a session serves, read by the server from its consumer label. */
export interface IServes {
  kind: 'kernel' | 'agent' | 'magics' | 'tool' | 'user' | 'other' | string;
  name: string;
}

/** A session's recent usage, as GET usage gives it. */
export interface ISessionUsageHistory {
  id: string;
  owner?: string | null;
  consumer: string;
  serves: IServes;
  paused?: boolean;
  /** Oldest first. */
  samples: IUsageSample[];
  /** The last measure whole (the provider's note says what it cannot measure). */
  last: ISessionUsage | null;
}

/** GET usage. */
export interface IUsageAnswer {
  interval_seconds: number;
  samples_kept: number;
  sampling: boolean;
  sessions: ISessionUsageHistory[];
}

export type UsageMetric = 'cpu' | 'memory' | 'disk';

export const USAGE_METRICS: UsageMetric[] = ['cpu', 'memory', 'disk'];

/** The short word a sparkline shows by. */
export const METRIC_LABELS: Record<UsageMetric, string> = { cpu: 'cpu', memory: 'mem', disk: 'disk' };

/** A sparkline's size in CSS pixels (the SVG's viewBox). */
export const SPARK_WIDTH = 30;
export const SPARK_HEIGHT = 10;

const isNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);

/** A sample's value of a metric, or null where it was not measured. */
export function metricValue(sample: IUsageSample, metric: UsageMetric): number | null {
  const value = metric === 'cpu' ? sample.cpu : metric === 'memory' ? sample.memory_bytes : sample.disk_bytes;
  return isNumber(value) && value >= 0 ? value : null;
}

/** `42%` of a core (`180%`: nearly two cores), a size in binary units. */
export function formatMetric(metric: UsageMetric, value: number): string {
  return metric === 'cpu' ? `${Math.round(value * 100)}%` : formatBytes(value);
}

export interface ISparkOptions {
  width?: number;
  height?: number;
  /**
   * Seconds the line spans, ending at the newest sample (so a session measured for a minute fills the
   * right part only); 0 or absent: from the oldest sample to the newest.
   */
  windowSeconds?: number;
}

/**
 * The points of a metric's sparkline, [x, y] in the SVG's coordinates (y down): time left to right, the
 * value from the bottom; CPU on a scale of at least one whole core, memory and disk on their own highest
 * value. Samples without the metric are left out.
 */
export function sparkPoints(
  samples: IUsageSample[],
  metric: UsageMetric,
  options: ISparkOptions = {}
): [number, number][] {
  const width = options.width ?? SPARK_WIDTH;
  const height = options.height ?? SPARK_HEIGHT;
  const measured = samples
    .filter(s => isNumber(s.time) && metricValue(s, metric) !== null)
    .map(s => [s.time, metricValue(s, metric) as number] as [number, number]);
  if (!measured.length) {
    return [];
  }
  const end = measured[measured.length - 1][0];
  const span = options.windowSeconds && options.windowSeconds > 0 ? options.windowSeconds : end - measured[0][0];
  const start = end - span;
  const highest = Math.max(...measured.map(([, v]) => v));
  const top = metric === 'cpu' ? Math.max(1, highest) : highest;
  const pad = 1; // the stroke's half width: a line at 0 or at the top stays whole
  const round = (n: number) => Math.round(n * 10) / 10;
  return measured
    .filter(([t]) => t >= start)
    .map(([t, v]) => {
      const x = span > 0 ? ((t - start) / span) * width : width;
      const y = height - pad - (top > 0 ? (v / top) * (height - 2 * pad) : 0);
      return [round(x), round(y)];
    });
}

/** The SVG path (`d`) of a metric's sparkline; '' when no sample has it. One point is a short dash. */
export function sparkPath(samples: IUsageSample[], metric: UsageMetric, options: ISparkOptions = {}): string {
  const points = sparkPoints(samples, metric, options);
  if (!points.length) {
    return '';
  }
  if (points.length === 1) {
    const [x, y] = points[0];
    return `M${Math.max(0, x - 3)} ${y}L${x} ${y}`;
  }
  return points.map(([x, y], i) => `${i ? 'L' : 'M'}${x} ${y}`).join('');
}

/** The newest value of a metric, or null. */
export function latestValue(samples: IUsageSample[], metric: UsageMetric): number | null {
  for (let i = samples.length - 1; i >= 0; i--) {
    const value = metricValue(samples[i], metric);
    if (value !== null) {
      return value;
    }
  }
  return null;
}

/**
 * A sparkline's tooltip: `cpu: 42% of a core now, at most 95% (12 samples over 55 s)`; what it means
 * for memory (resident, page cache excluded) and disk (the workspace).
 */
export function sparkTitle(samples: IUsageSample[], metric: UsageMetric): string {
  const values = samples.map(s => metricValue(s, metric)).filter((v): v is number => v !== null);
  if (!values.length) {
    return `${METRIC_LABELS[metric]}: not measured`;
  }
  const now = formatMetric(metric, values[values.length - 1]);
  const most = formatMetric(metric, Math.max(...values));
  const what = { cpu: ' of a core', memory: ' resident', disk: ' in the workspace' }[metric];
  const times = samples.filter(s => metricValue(s, metric) !== null).map(s => s.time);
  const over = times.length > 1 ? ` over ${Math.round(times[times.length - 1] - times[0])} s` : '';
  return `${METRIC_LABELS[metric]}: ${now}${what} now, at most ${most} (${values.length} sample${values.length === 1 ? '' : 's'}${over})`;
}

/**
 * What a session serves, in a few words: `kernel · analysis.ipynb` (a sandboxed kernel, by its
 * notebook when jupyter_server names it), `agent claude` (a coding agent's persona), `%sandbox NAME`,
 * `tool NAME`, `user NAME`.
 */
export function servesText(serves: IServes | null | undefined, kernels: Record<string, IKernelUser[]> = {}): string {
  if (!serves || typeof serves.kind !== 'string') {
    return '';
  }
  switch (serves.kind) {
    case 'kernel': {
      const users = kernels[serves.name] ?? [];
      return users.length
        ? `kernel · ${users.map(u => u.path.split('/').pop() || u.path).join(', ')}`
        : `kernel ${serves.name.slice(0, 8)}`;
    }
    case 'agent':
      return `agent ${serves.name}`;
    case 'magics':
      return `%sandbox ${safeDecode(serves.name)}`;
    case 'tool':
    case 'user':
      return `${serves.kind} ${safeDecode(serves.name)}`;
    default:
      return serves.name;
  }
}

function safeDecode(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}
