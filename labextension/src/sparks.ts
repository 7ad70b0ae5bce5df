/**
 * The thin line under a session's row: a sparkline each for CPU, memory and disk over the last minutes
 * (drawn by usage.ts from GET usage's samples), and what the session serves. Each sparkline's tooltip
 * says its value now and its highest; a metric the provider cannot measure (local: CPU, memory) is left
 * out.
 */
import { IKernelUser } from './kernels';
import {
  ISessionUsageHistory,
  METRIC_LABELS,
  SPARK_HEIGHT,
  SPARK_WIDTH,
  USAGE_METRICS,
  latestValue,
  sparkPath,
  sparkPoints,
  sparkTitle,
  servesText
} from './usage';

const SVG = 'http://www.w3.org/2000/svg';

/** The (hidden, until samples come) line of sparklines of one session. */
export function makeSparks(): HTMLElement {
  const line = document.createElement('div');
  line.className = 'jp-TaiSandbox-sparks';
  line.hidden = true;
  for (const metric of USAGE_METRICS) {
    const spark = document.createElement('span');
    spark.className = 'jp-TaiSandbox-spark';
    spark.dataset.metric = metric;
    const label = document.createElement('span');
    label.className = 'jp-TaiSandbox-sparkLabel';
    label.textContent = METRIC_LABELS[metric];
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('class', 'jp-TaiSandbox-sparkLine');
    svg.setAttribute('width', String(SPARK_WIDTH));
    svg.setAttribute('height', String(SPARK_HEIGHT));
    svg.setAttribute('viewBox', `0 0 ${SPARK_WIDTH} ${SPARK_HEIGHT}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('aria-hidden', 'true');
    const path = document.createElementNS(SVG, 'path');
    path.setAttribute('fill', 'none');
    svg.append(path);
    spark.append(label, svg);
    line.append(spark);
  }
  const serves = document.createElement('span');
  serves.className = 'jp-TaiSandbox-serves';
  line.append(serves);
  return line;
}

/** Draw a session's samples into its line (hidden while nothing is measured). */
export function fillSparks(
  line: HTMLElement,
  history: ISessionUsageHistory | undefined,
  kernels: Record<string, IKernelUser[]>
): void {
  const samples = history?.samples ?? [];
  let shown = 0;
  for (const metric of USAGE_METRICS) {
    const spark = line.querySelector(`.jp-TaiSandbox-spark[data-metric="${metric}"]`) as HTMLElement;
    const d = sparkPath(samples, metric);
    spark.hidden = !d;
    if (!d) {
      continue;
    }
    shown++;
    spark.querySelector('path')?.setAttribute('d', d);
    spark.dataset.points = String(sparkPoints(samples, metric).length);
    spark.dataset.latest = String(latestValue(samples, metric));
    const title = sparkTitle(samples, metric);
    spark.title = title;
    spark.setAttribute('aria-label', title);
  }
  const serves = line.querySelector('.jp-TaiSandbox-serves') as HTMLElement;
  const text = history ? servesText(history.serves, kernels) : '';
  serves.textContent = text;
  serves.title = history ? `serves ${history.consumer}` : '';
  line.hidden = !shown && !text;
  line.dataset.samples = String(samples.length);
}
