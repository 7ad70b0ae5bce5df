import { describe, expect, it } from 'vitest';

import { fillSparks, makeSparks } from '../src/sparks';
import {
  ISessionUsageHistory,
  IUsageSample,
  SPARK_HEIGHT,
  SPARK_WIDTH,
  latestValue,
  sparkPath,
  sparkPoints,
  sparkTitle,
  servesText
} from '../src/usage';

const MiB = 1024 * 1024;

function sample(time: number, cpu: number | null, memory: number | null, disk: number | null): IUsageSample {
  return { time, cpu, memory_bytes: memory, disk_bytes: disk };
}

const DOCKER: IUsageSample[] = [
  sample(100, null, 10 * MiB, 4096),
  sample(105, 0.5, 20 * MiB, 4096),
  sample(110, 1.5, 40 * MiB, 8192),
  sample(115, 0.25, 30 * MiB, 8192)
];

describe('sparklines', () => {
  it('draws time left to right and the value from the bottom', () => {
    const points = sparkPoints(DOCKER, 'memory');
    expect(points.map(([x]) => x)).toEqual([0, 10, 20, 30]);
    // 40 MiB, the highest, at the top (inside the stroke's pad); 10 MiB a quarter of the way up
    expect(points[2][1]).toBe(1);
    expect(points[0][1]).toBe(SPARK_HEIGHT - 1 - 0.25 * (SPARK_HEIGHT - 2));
    expect(sparkPath(DOCKER, 'memory')).toBe('M0 7L10 5L20 1L30 3');
  });

  it('puts CPU on a scale of at least one core and leaves out samples without the metric', () => {
    const points = sparkPoints(DOCKER, 'cpu');
    expect(points).toHaveLength(3); // the first sample has no CPU fraction yet
    expect(points[0][0]).toBe(0); // the line starts at the first sample that has it
    expect(points[1][1]).toBe(1); // 1.5 cores: the scale grows to it
    const idle = [sample(0, 0.1, null, null), sample(5, 0.2, null, null)];
    const y = sparkPoints(idle, 'cpu').map(([, v]) => v);
    expect(y[1]).toBeCloseTo(SPARK_HEIGHT - 1 - 0.2 * (SPARK_HEIGHT - 2)); // a fifth of a core: low, not the top
  });

  it('spans a window ending at the newest sample when asked, so a young session fills the right part', () => {
    const points = sparkPoints(DOCKER, 'disk', { windowSeconds: 60 });
    expect(points[0][0]).toBe(((100 - 55) / 60) * SPARK_WIDTH);
    expect(points[points.length - 1][0]).toBe(SPARK_WIDTH);
  });

  it('says nothing for a metric never measured, a dash for one sample, a flat line at zero', () => {
    const local = [sample(1, null, null, 100), sample(6, null, null, 100)];
    expect(sparkPath(local, 'cpu')).toBe('');
    expect(sparkPath(local, 'memory')).toBe('');
    expect(sparkPath([sample(1, null, null, 5)], 'disk')).toBe(`M${SPARK_WIDTH - 3} 1L${SPARK_WIDTH} 1`);
    const zero = sparkPoints([sample(1, 0, 0, 0), sample(2, 0, 0, 0)], 'disk');
    expect(zero.every(([, y]) => y === SPARK_HEIGHT - 1)).toBe(true);
    expect(sparkPath([], 'disk')).toBe('');
    expect(sparkPath([{ time: NaN, cpu: 1, memory_bytes: 1, disk_bytes: 1 }], 'disk')).toBe('');
  });

  it('titles a sparkline with its value now and its highest', () => {
    expect(sparkTitle(DOCKER, 'cpu')).toBe('cpu: 25% of a core now, at most 150% (3 samples over 10 s)');
    expect(sparkTitle(DOCKER, 'memory')).toBe('mem: 30 MiB resident now, at most 40 MiB (4 samples over 15 s)');
    expect(sparkTitle([], 'disk')).toBe('disk: not measured');
    expect(latestValue(DOCKER, 'disk')).toBe(8192);
    expect(latestValue([sample(1, null, null, null)], 'cpu')).toBeNull();
  });

  it('names what a session serves', () => {
    const kernels = { 'k-1': [{ path: 'work/analysis.ipynb', name: 'analysis.ipynb', type: 'notebook' }] };
    expect(servesText({ kind: 'kernel', name: 'k-1' }, kernels)).toBe('kernel · analysis.ipynb');
    expect(servesText({ kind: 'kernel', name: '0123456789abcdef' }, kernels)).toBe('kernel 01234567');
    expect(servesText({ kind: 'agent', name: 'claude' })).toBe('agent claude');
    expect(servesText({ kind: 'magics', name: 'my%20box' })).toBe('%sandbox my box');
    expect(servesText({ kind: 'user', name: 'alice' })).toBe('user alice');
    expect(servesText({ kind: 'tool', name: 'word_count' })).toBe('tool word_count');
    expect(servesText(undefined)).toBe('');
  });
});

describe('the sparkline row', () => {
  const history = (samples: IUsageSample[]): ISessionUsageHistory => ({
    id: 'a',
    consumer: 'agent:claude',
    serves: { kind: 'agent', name: 'claude' },
    samples,
    last: null
  });

  it('draws one SVG path per measured metric and hides the others', () => {
    const line = makeSparks();
    expect(line.hidden).toBe(true);
    fillSparks(line, history(DOCKER), {});
    expect(line.hidden).toBe(false);
    const spark = (metric: string) => line.querySelector(`.jp-TaiSandbox-spark[data-metric="${metric}"]`) as HTMLElement;
    expect(spark('memory').querySelector('svg path')!.getAttribute('d')).toBe('M0 7L10 5L20 1L30 3');
    expect(spark('memory').dataset.points).toBe('4');
    expect(spark('cpu').title).toContain('of a core');
    expect(line.querySelector('.jp-TaiSandbox-serves')!.textContent).toBe('agent claude');
    // local: disk only
    fillSparks(line, history([sample(1, null, null, 100), sample(6, null, null, 200)]), {});
    expect(spark('cpu').hidden).toBe(true);
    expect(spark('memory').hidden).toBe(true);
    expect(spark('disk').hidden).toBe(false);
    fillSparks(line, undefined, {});
    expect(line.hidden).toBe(true);
  });
});
