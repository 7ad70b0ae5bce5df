/**
 * Web previews (issue 54): a session's listening ports as the panel lists them, and the
 * JupyterLab tab that shows one (an iframe of `<base_url>api/sandbox/sessions/ID/ports/PORT/`
 * with reload and "Open in a browser tab").
 *
 * The iframe is sandboxed without `allow-same-origin`, as the server's
 * `Content-Security-Policy: sandbox ...` on every proxied answer: the app's document has an
 * opaque origin, so its script can neither call `/api/*` with the user's cookies, nor read them,
 * nor set a cookie on the Jupyter origin. The iframe's own sandbox only repeats that; it never
 * grants more than the server's CSP does.
 *
 * When the server serves previews on origins of their own (PreviewSettings.origin_template: the
 * listing gives each port its `origin`, and the Jupyter-origin URL redirects there), the iframe
 * adds `allow-same-origin`: the app's document then keeps that origin (its own files, fetches,
 * websockets and cookies work), which is neither Jupyter's nor another session port's; anything
 * still answered on the Jupyter origin carries the server's CSP sandbox, which stays opaque.
 */
import { MainAreaWidget, ToolbarButton } from '@jupyterlab/apputils';
import { launchIcon, refreshIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { IListeningPort } from './api';
import { button } from './files';

/** The command that opens a preview tab: `{ id, port }`. */
export const OPEN_PREVIEW = 'tai-sandbox:open-preview';

/** Seconds between two listings of an open session's ports while the panel shows it. */
export const PORTS_SECONDS = 5;

/**
 * The iframe's sandbox: what the server's CSP `sandbox` allows (scripts, forms, popups, modals,
 * downloads), never `allow-same-origin` (nor top navigation).
 */
export const PREVIEW_SANDBOX = ['allow-scripts', 'allow-forms', 'allow-popups', 'allow-modals', 'allow-downloads'];

/**
 * The preview URL of a session's port (A's route): `<base_url>api/sandbox/sessions/ID/ports/PORT/`.
 * `baseUrl` is the server's (ServerConnection settings), with or without its trailing slash.
 */
export function previewUrl(baseUrl: string, sessionId: string, port: number, path = ''): string {
  const base = baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`;
  const rest = path.replace(/^\/+/, '');
  return `${base}api/sandbox/sessions/${encodeURIComponent(sessionId)}/ports/${port}/${rest}`;
}

/** A port's line in the panel: `8000 (all addresses)`, `5000 (127.0.0.1)`. */
export function portLabel(port: IListeningPort): string {
  const address = port.address ?? '';
  const where = !address || address === '0.0.0.0' || address === '::' ? 'all addresses' : address;
  return `${port.port} (${where})`;
}

/** The ports sorted and one per number (a port on 0.0.0.0 and :: shows once). */
export function uniquePorts(ports: IListeningPort[]): IListeningPort[] {
  const byPort = new Map<number, IListeningPort>();
  for (const p of ports) {
    if (typeof p?.port === 'number' && !byPort.has(p.port)) {
      byPort.set(p.port, p);
    }
  }
  return [...byPort.values()].sort((a, b) => a.port - b.port);
}

/**
 * Fill a session's "Ports" list: one line per port with an Open button, or why there is none.
 * `error` is the listing's failure (shown instead of the ports).
 */
export function fillPortsList(
  list: HTMLElement,
  ports: IListeningPort[] | null,
  error: string | null,
  open: (port: number, listed: IListeningPort) => void
): void {
  const key = JSON.stringify([ports?.map(p => [p.port, p.address]) ?? null, error]);
  if (list.dataset.shown === key) {
    return;
  }
  list.dataset.shown = key;
  if (error) {
    const line = document.createElement('li');
    line.className = 'jp-TaiSandbox-portsNote jp-mod-error';
    line.textContent = `Cannot list the ports: ${error}`;
    list.replaceChildren(line);
    return;
  }
  if (ports === null) {
    const line = document.createElement('li');
    line.className = 'jp-TaiSandbox-portsNote';
    line.textContent = 'Listing the ports…';
    list.replaceChildren(line);
    return;
  }
  const shown = uniquePorts(ports);
  if (!shown.length) {
    const line = document.createElement('li');
    line.className = 'jp-TaiSandbox-portsNote';
    line.textContent = 'No port is listening (start a web app in the session: it shows here).';
    list.replaceChildren(line);
    return;
  }
  list.replaceChildren(
    ...shown.map(p => {
      const line = document.createElement('li');
      line.className = 'jp-TaiSandbox-port';
      line.dataset.port = String(p.port);
      const label = document.createElement('span');
      label.className = 'jp-TaiSandbox-portLabel';
      label.textContent = portLabel(p);
      const openButton = button('Open', `Open port ${p.port} of this session in a JupyterLab tab`, () => open(p.port, p));
      openButton.classList.add('jp-TaiSandbox-openPort');
      line.append(label, openButton);
      return line;
    })
  );
}

/** The iframe of a preview, sandboxed (see PREVIEW_SANDBOX; `ownOrigin`: see the module's comment). */
export class PreviewFrame extends Widget {
  constructor(
    readonly url: string,
    readonly ownOrigin = false
  ) {
    super();
    this.addClass('jp-TaiSandbox-previewFrame');
    this.iframe = document.createElement('iframe');
    const sandbox = ownOrigin ? [...PREVIEW_SANDBOX, 'allow-same-origin'] : PREVIEW_SANDBOX;
    this.iframe.setAttribute('sandbox', sandbox.join(' '));
    this.iframe.setAttribute('referrerpolicy', 'no-referrer');
    this.iframe.src = url;
    this.node.append(this.iframe);
  }

  /** Load the page again (from the app, through the preview route). */
  reload(): void {
    // an opaque-origin document cannot be reached from here (contentWindow.location is cross-origin)
    this.iframe.src = this.url;
  }

  readonly iframe: HTMLIFrameElement;
}

export namespace PreviewWidget {
  export interface IOptions {
    sessionId: string;
    port: number;
    url: string;
    /** the app is served on an origin of its own (the listing gave the port an `origin`) */
    ownOrigin?: boolean;
    /** a session's name in the tab's title (its id when it has none) */
    label?: string;
    /** opens a URL in a new browser tab (window.open by default) */
    openWindow?: (url: string) => void;
  }
}

/** The preview tab: the iframe, and a toolbar with reload and "Open in a browser tab". */
export class PreviewWidget extends MainAreaWidget<PreviewFrame> {
  constructor(options: PreviewWidget.IOptions) {
    const content = new PreviewFrame(options.url, options.ownOrigin === true);
    super({ content });
    this.sessionId = options.sessionId;
    this.port = options.port;
    this.id = previewWidgetId(options.sessionId, options.port);
    this.addClass('jp-TaiSandbox-preview');
    this.node.dataset.sessionId = options.sessionId;
    this.node.dataset.port = String(options.port);
    this.title.label = `${options.label ?? options.sessionId}:${options.port}`;
    this.title.caption = `Port ${options.port} of sandbox session ${options.sessionId}\n${options.url}`;
    this.title.closable = true;
    const openWindow = options.openWindow ?? ((url: string) => void window.open(url, '_blank', 'noopener,noreferrer'));
    this.toolbar.addItem(
      'reload',
      new ToolbarButton({
        icon: refreshIcon,
        tooltip: 'Reload the preview',
        className: 'jp-TaiSandbox-previewReload',
        onClick: () => content.reload()
      })
    );
    this.toolbar.addItem(
      'open-in-browser',
      new ToolbarButton({
        icon: launchIcon,
        label: 'Open in a browser tab',
        tooltip: 'Open this preview in a browser tab of its own (it needs your Jupyter login: the URL carries no token)',
        className: 'jp-TaiSandbox-previewOpenBrowser',
        onClick: () => openWindow(options.url)
      })
    );
  }

  readonly sessionId: string;
  readonly port: number;
}

/** The DOM id of a session's port's preview tab (one tab per session and port). */
export function previewWidgetId(sessionId: string, port: number): string {
  return `jp-TaiSandbox-preview-${sessionId.replace(/[^A-Za-z0-9_-]/g, '_')}-${port}`;
}
