/**
 * Issue 54: a session's "Ports" list (GET sessions/{id}/ports, listed on expand, again on demand and
 * while shown) with Open, and the preview tab (a sandboxed iframe of the preview URL, reload, "Open in
 * a browser tab"). The panel, the model and the client are the real ones; only fetch answers from a script.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Widget } from '@lumino/widgets';

import { IListeningPort, SandboxClient } from '../src/api';
import { SessionsModel } from '../src/model';
import { SandboxPanel } from '../src/panel';
import {
  PREVIEW_SANDBOX,
  PreviewWidget,
  fillPortsList,
  portLabel,
  previewUrl,
  previewWidgetId,
  uniquePorts
} from '../src/previews';
import { IRecorded, LOCAL_STATUS, fakeSettings, json, sessionInfo } from './fakes';

const PLAIN = sessionInfo('sbx-plain');

// what jsdom lacks and MainAreaWidget's toolbar (ReactiveToolbar) uses
const scope = globalThis as { ResizeObserver?: unknown };
scope.ResizeObserver ??= class {
  observe(): void {}
  unobserve(): void {}
  disconnect(): void {}
};

const attached: Widget[] = [];
afterEach(() => {
  attached.splice(0).forEach(w => w.dispose());
  vi.useRealTimers();
});

/** A server whose ports route answers from `ports` (a function: what it answers now). */
function server(ports: () => Response) {
  const route = (request: IRecorded) => {
    if (request.url.endsWith('/api/sandbox/status')) {
      return json({ ...LOCAL_STATUS, max_isolation: 'none' });
    }
    if (request.url.endsWith('/api/sandbox/sessions')) {
      return json({ sessions: [PLAIN] });
    }
    if (request.url.endsWith('/api/sandbox/sessions/sbx-plain/ports')) {
      return ports();
    }
    if (request.url.endsWith('/api/sessions')) {
      return json([]);
    }
    return json({ error: 'SandboxRequestError', message: `unexpected ${request.method} ${request.url}` }, 400);
  };
  return fakeSettings(Array.from({ length: 80 }, () => route));
}

async function panelWith(ports: () => Response, withPorts = true) {
  const { settings, requests } = server(ports);
  const client = new SandboxClient(settings);
  const model = new SessionsModel({ client });
  const opened: string[] = [];
  const panel = new SandboxPanel({
    model,
    actions: {
      newSession: () => undefined,
      openTerminal: () => undefined,
      openFiles: () => undefined,
      destroy: () => undefined,
      extendTtl: async () => undefined,
      extendTtlBy: () => undefined,
      setPaused: async () => undefined,
      fork: async () => undefined,
      openDocument: () => undefined,
      ...(withPorts
        ? {
            listPorts: (id: string) => client.listPorts(id),
            openPreview: (id: string, port: number) => void opened.push(`${id}:${port}`)
          }
        : {})
    }
  });
  Widget.attach(panel, document.body);
  attached.push(panel);
  await model.refresh();
  const li = panel.node.querySelector('.jp-TaiSandbox-session[data-session-id="sbx-plain"]') as HTMLElement;
  return { panel, li, opened, requests };
}

const portsRequests = (requests: IRecorded[]) => requests.filter(r => r.url.endsWith('/sbx-plain/ports'));
const portLines = (li: HTMLElement) =>
  [...li.querySelectorAll('.jp-TaiSandbox-port')].map(l => l.querySelector('.jp-TaiSandbox-portLabel')!.textContent);

describe('the preview URL', () => {
  it("is A's route under the server's base URL, the session id encoded", () => {
    expect(previewUrl('http://lab.test/base/', 'sbx-1', 8000)).toBe('http://lab.test/base/api/sandbox/sessions/sbx-1/ports/8000/');
    expect(previewUrl('/', 'a b', 5000, '/x/y?q=1')).toBe('/api/sandbox/sessions/a%20b/ports/5000/x/y?q=1');
    expect(previewUrl('http://h/base', 's', 1)).toBe('http://h/base/api/sandbox/sessions/s/ports/1/');
  });

  it('the client asks GET sessions/{id}/ports with the token, and reads its ports', async () => {
    const { settings, requests } = fakeSettings([json({ ports: [{ port: 8000, address: '0.0.0.0' }] })]);
    const ports = await new SandboxClient(settings).listPorts('sbx-1');
    expect(ports).toEqual([{ port: 8000, address: '0.0.0.0' }]);
    expect(requests[0].method).toBe('GET');
    expect(requests[0].url).toBe('http://lab.test/base/api/sandbox/sessions/sbx-1/ports');
    expect(requests[0].headers.get('Authorization')).toBe('token secret-token');
  });
});

describe('the Ports list', () => {
  it('one line per port, sorted, a port on two addresses once', () => {
    const ports: IListeningPort[] = [
      { port: 8000, address: '::' },
      { port: 5000, address: '127.0.0.1' },
      { port: 8000, address: '0.0.0.0' }
    ];
    expect(uniquePorts(ports).map(portLabel)).toEqual(['5000 (127.0.0.1)', '8000 (all addresses)']);
    const list = document.createElement('ul');
    const opened: number[] = [];
    fillPortsList(list, ports, null, port => opened.push(port));
    (list.querySelector('[data-port="8000"] .jp-TaiSandbox-openPort') as HTMLButtonElement).click();
    expect(opened).toEqual([8000]);
    fillPortsList(list, [], null, () => undefined);
    expect(list.textContent).toMatch(/No port is listening/);
    fillPortsList(list, null, 'session sbx-1 is gone', () => undefined);
    expect(list.textContent).toBe('Cannot list the ports: session sbx-1 is gone');
  });

  it("lists a session's ports when its details open, and Open opens that port's preview", async () => {
    const { li, opened, requests } = await panelWith(() =>
      json({ ports: [{ port: 8000, address: '0.0.0.0' }, { port: 9001, address: '127.0.0.1' }] })
    );
    expect(portsRequests(requests)).toHaveLength(0); // folded: not asked
    (li.querySelector('.jp-TaiSandbox-sessionRow') as HTMLElement).click();
    await vi.waitFor(() => expect(portLines(li)).toEqual(['8000 (all addresses)', '9001 (127.0.0.1)']));
    expect((li.querySelector('.jp-TaiSandbox-ports') as HTMLElement).hidden).toBe(false);
    (li.querySelector('.jp-TaiSandbox-port[data-port="9001"] .jp-TaiSandbox-openPort') as HTMLButtonElement).click();
    expect(opened).toEqual(['sbx-plain:9001']);
    // Open does not fold the row
    expect((li.querySelector('.jp-TaiSandbox-sessionBody') as HTMLElement).hidden).toBe(false);
  });

  it('lists them again on demand and while shown; a failure is said in the list', async () => {
    let answer: () => Response = () => json({ ports: [] });
    const { panel, li, requests } = await panelWith(() => answer());
    (li.querySelector('.jp-TaiSandbox-sessionRow') as HTMLElement).click();
    await vi.waitFor(() => expect(li.querySelector('.jp-TaiSandbox-portsList')!.textContent).toMatch(/No port/));
    answer = () => json({ ports: [{ port: 8000, address: '0.0.0.0' }] });
    (li.querySelector('.jp-TaiSandbox-refreshPorts') as HTMLButtonElement).click();
    await vi.waitFor(() => expect(portLines(li)).toEqual(['8000 (all addresses)']));
    expect((li.querySelector('.jp-TaiSandbox-sessionBody') as HTMLElement).hidden).toBe(false);
    answer = () => json({ error: 'SandboxSessionNotFound', message: 'no session sbx-plain' }, 404);
    const before = portsRequests(requests).length;
    // the panel's one-second tick lists an open session's ports again after PORTS_SECONDS
    await vi.waitFor(() => expect(portsRequests(requests).length).toBeGreaterThan(before), { timeout: 8000 });
    await vi.waitFor(() => expect(li.querySelector('.jp-TaiSandbox-portsList')!.textContent).toMatch(/^Cannot list the ports: /));
    expect(panel.isVisible).toBe(true);
  }, 20_000);

  it("is not shown for a session whose provider cannot list its ports (local), nor asked again", async () => {
    const { li, requests } = await panelWith(() =>
      json({ error: 'SandboxUnsupportedError', message: 'a local session cannot list its ports', operation: 'ports' }, 400)
    );
    const section = li.querySelector('.jp-TaiSandbox-ports') as HTMLElement;
    expect(section.hidden).toBe(true);
    (li.querySelector('.jp-TaiSandbox-sessionRow') as HTMLElement).click();
    await vi.waitFor(() => expect(portsRequests(requests)).toHaveLength(1));
    await new Promise(resolve => setTimeout(resolve, 50));
    expect(section.hidden).toBe(true);
    (li.querySelector('.jp-TaiSandbox-refreshPorts') as HTMLButtonElement).click();
    const row = li.querySelector('.jp-TaiSandbox-sessionRow') as HTMLElement;
    row.click();
    row.click();
    expect(portsRequests(requests)).toHaveLength(1);
  });

  it('is not shown by a panel given no way to list ports', async () => {
    const { li, requests } = await panelWith(() => json({ ports: [] }), false);
    (li.querySelector('.jp-TaiSandbox-sessionRow') as HTMLElement).click();
    expect((li.querySelector('.jp-TaiSandbox-ports') as HTMLElement).hidden).toBe(true);
    expect(portsRequests(requests)).toHaveLength(0);
  });
});

describe('the preview tab', () => {
  it('is an iframe of the preview URL, sandboxed without allow-same-origin', () => {
    const url = previewUrl('http://lab.test/base/', 'sbx-1', 8000);
    const widget = new PreviewWidget({ sessionId: 'sbx-1', port: 8000, url });
    Widget.attach(widget, document.body);
    attached.push(widget);
    const iframe = widget.node.querySelector('iframe') as HTMLIFrameElement;
    expect(iframe.src).toBe(url);
    const sandbox = iframe.getAttribute('sandbox')!.split(' ');
    expect(sandbox).toEqual(PREVIEW_SANDBOX);
    expect(sandbox).not.toContain('allow-same-origin');
    expect(sandbox).not.toContain('allow-top-navigation');
    expect(sandbox).toEqual(['allow-scripts', 'allow-forms', 'allow-popups', 'allow-modals', 'allow-downloads']);
    expect(widget.id).toBe(previewWidgetId('sbx-1', 8000));
    expect(widget.title.label).toBe('sbx-1:8000');
    expect(widget.title.closable).toBe(true);
  });

  it('adds allow-same-origin only for a port served on an origin of its own (the listing gave it one)', () => {
    const url = previewUrl('http://lab.test/base/', 'sbx-1', 8000);
    const widget = new PreviewWidget({ sessionId: 'sbx-1', port: 8000, url, ownOrigin: true });
    Widget.attach(widget, document.body);
    attached.push(widget);
    const iframe = widget.node.querySelector('iframe') as HTMLIFrameElement;
    expect(iframe.src).toBe(url); // the Jupyter URL still: it redirects to the port's origin
    const sandbox = iframe.getAttribute('sandbox')!.split(' ');
    expect(sandbox).toEqual([...PREVIEW_SANDBOX, 'allow-same-origin']);
    expect(sandbox).not.toContain('allow-top-navigation');
    const list = document.createElement('ul');
    const opened: [number, string | undefined][] = [];
    fillPortsList(list, [{ port: 8000, address: '0.0.0.0', origin: 'http://sbx-1-8000.preview.localhost:8888' }], null, (port, listed) =>
      opened.push([port, listed.origin])
    );
    (list.querySelector('[data-port="8000"] .jp-TaiSandbox-openPort') as HTMLButtonElement).click();
    expect(opened).toEqual([[8000, 'http://sbx-1-8000.preview.localhost:8888']]);
  });

  it('reloads, and opens the same URL in a browser tab', async () => {
    const url = previewUrl('http://lab.test/base/', 'sbx-1', 8000);
    const windows: string[] = [];
    const widget = new PreviewWidget({ sessionId: 'sbx-1', port: 8000, url, openWindow: u => windows.push(u) });
    Widget.attach(widget, document.body);
    attached.push(widget);
    const iframe = widget.node.querySelector('iframe') as HTMLIFrameElement;
    iframe.src = 'about:blank'; // as if the app navigated away
    widget.content.reload();
    expect(iframe.src).toBe(url);
    const names = [...widget.toolbar.names()];
    expect(names.slice(0, 2)).toEqual(['reload', 'open-in-browser']);
    // the toolbar's buttons render (React) a moment later
    const clickable = async (cls: string) => {
      let found: HTMLElement | null = null;
      await vi.waitFor(() => {
        const el = widget.node.querySelector(`.${cls}`) as HTMLElement | null;
        found = el;
        expect(found).not.toBeNull();
      });
      return found! as HTMLElement;
    };
        const press = (el: HTMLElement) => el.click();
    press(await clickable('jp-TaiSandbox-previewOpenBrowser'));
    expect(windows).toEqual([url]);
    iframe.src = 'about:blank';
    press(await clickable('jp-TaiSandbox-previewReload'));
    expect(iframe.src).toBe(url);
  });
});
