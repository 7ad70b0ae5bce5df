/**
 * Issue 26 point 4: the panel as several plugins sharing the sessions through a token; the
 * settings keep the schema's plugin id; the drive's browser joins the file browsers' tracker
 * on first use through public API only (no WidgetTracker private field).
 */
import { readFileSync, readdirSync } from 'fs';
import { join } from 'path';
import { afterEach, describe, expect, it } from 'vitest';
import { WidgetTracker } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { SandboxClient } from '../src/api';
import { CommandIDs, stringArg } from '../src/commands';
import { trackOnFirstUse } from '../src/tracking';
import { SandboxSessions } from '../src/sessions';
import { DEFAULT_SETTINGS, SETTINGS_PLUGIN_ID, readSettings } from '../src/settings';
import { ISandboxSessions, ISandboxTerminalTracker } from '../src/tokens';
import { fakeSettings, json, sessionInfo } from './fakes';

const root = join(__dirname, '..');

function source(values: Record<string, unknown>) {
  return { get: (key: string) => ({ composite: values[key] }) };
}

describe('settings', () => {
  it('belong to a plugin id that has a schema file (package name : file name)', () => {
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
    const schemas = readdirSync(join(root, pkg.jupyterlab.schemaDir))
      .filter(name => name.endsWith('.json'))
      .map(name => `${pkg.name}:${name.replace(/\.json$/, '')}`);
    expect(schemas).toContain(SETTINGS_PLUGIN_ID);
  });

  it('read the schema keys, with the defaults for what is unset and an empty command', () => {
    expect(readSettings(source({}))).toEqual(DEFAULT_SETTINGS);
    expect(
      readSettings(
        source({
          defaultImage: 'python:3.12',
          defaultTtlSeconds: 600,
          defaultNetwork: 'none',
          terminalCommand: [],
          pollIntervalSeconds: 10
        })
      )
    ).toEqual({
      image: 'python:3.12',
      ttlSeconds: 600,
      network: 'none',
      terminalCommand: ['sh', '-i'],
      pollIntervalSeconds: 10
    });
  });
});

describe('the plugins', () => {
  it('are exported as an array with distinct ids, the sessions plugin keeping the settings id', async () => {
    const plugins = (await import('../src/index')).default;
    const ids = plugins.map(plugin => plugin.id);
    expect(ids).toEqual([
      SETTINGS_PLUGIN_ID,
      'jupyter-tai-sandbox:panel',
      'jupyter-tai-sandbox:terminals',
      'jupyter-tai-sandbox:files',
      'jupyter-tai-sandbox:drive',
      'jupyter-tai-sandbox:running'
    ]);
    // the sessions plugin provides the token the others require (shared state, no closures)
    const provider = plugins[0];
    expect(provider.provides).toBe(ISandboxSessions);
    for (const plugin of plugins.slice(1)) {
      expect(plugin.requires).toContain(ISandboxSessions);
    }
    // the terminal tabs' tracker: provided by one, used by the Running sidebar's plugin
    expect(plugins[2].provides).toBe(ISandboxTerminalTracker);
    expect(plugins[5].optional).toContain(ISandboxTerminalTracker);
  });

  it('take a command argument only when it is a non-empty string', () => {
    expect(stringArg({ id: 'sbx-1' }, 'id')).toBe('sbx-1');
    expect(stringArg({ id: '' }, 'id')).toBeNull();
    expect(stringArg({ id: 3 }, 'id')).toBeNull();
    expect(stringArg(undefined, 'id')).toBeNull();
    expect(CommandIDs.showPanel).toBe('tai-sandbox:show-panel');
  });
});

describe('SandboxSessions', () => {
  const made: SandboxSessions[] = [];
  afterEach(() => made.splice(0).forEach(s => s.model.dispose()));

  function sessions(replies: Parameters<typeof fakeSettings>[0]) {
    const { settings, requests } = fakeSettings(replies);
    const shown: string[] = [];
    const result = new SandboxSessions({
      client: new SandboxClient(settings),
      showPanel: () => shown.push('panel')
    });
    made.push(result);
    return { sessions: result, requests, shown };
  }

  it('refresh while a view is visible and stand by when none is (the panel, the Running sidebar)', () => {
    const { sessions: s } = sessions([]);
    let panelVisible = false;
    let runningVisible = false;
    s.addView(() => panelVisible);
    const running = s.addView(() => runningVisible);
    expect(s.anyViewVisible()).toBe(false);
    runningVisible = true;
    expect(s.anyViewVisible()).toBe(true);
    running.dispose();
    expect(s.anyViewVisible()).toBe(false);
    panelVisible = true;
    expect(s.anyViewVisible()).toBe(true);
  });

  it('apply new settings: the refresh interval at once, the terminal command on next use', () => {
    const { sessions: s } = sessions([]);
    expect(s.settings).toEqual(DEFAULT_SETTINGS);
    s.setSettings({ ...DEFAULT_SETTINGS, terminalCommand: ['bash'], pollIntervalSeconds: 7 });
    expect(s.settings.terminalCommand).toEqual(['bash']);
  });

  it('report an error to the panel (errorChanged) and clear it', () => {
    const { sessions: s } = sessions([]);
    const seen: unknown[] = [];
    s.errorChanged.connect((_, error) => seen.push(error));
    s.reportError('Could not create the session:', 'over the cap');
    s.clearError();
    expect(seen).toEqual([{ title: 'Could not create the session:', message: 'over the cap' }, null]);
  });

  it('take a session gone from the server (404) out of the list', async () => {
    const { sessions: s } = sessions([
      json({ error: 'SessionNotFoundError', message: 'no session sbx-1' }, 404)
    ]);
    s.model.addLocally(sessionInfo('sbx-1'));
    expect(await s.fetchSession('sbx-1', 'open a terminal')).toBeNull();
    expect(s.model.find('sbx-1')).toBeUndefined();
  });

  it('destroy from the Running sidebar: what shows the session closes, gone or not; a failure throws', async () => {
    const { sessions: s, requests } = sessions([
      new Response(null, { status: 204 }),
      json({ error: 'SessionNotFoundError', message: 'gone' }, 404),
      json({ error: 'SandboxError', message: 'engine down' }, 500)
    ]);
    const destroyed: string[] = [];
    s.destroyed.connect((_, id) => destroyed.push(id));
    await s.destroyNow('sbx-1');
    await s.destroyNow('sbx-2');
    await expect(s.destroyNow('sbx-3')).rejects.toThrow('engine down');
    expect(destroyed).toEqual(['sbx-1', 'sbx-2']);
    expect(requests.map(r => `${r.method} ${r.url.split('/api/')[1]}`)).toEqual([
      'DELETE sandbox/sessions/sbx-1',
      'DELETE sandbox/sessions/sbx-2',
      'DELETE sandbox/sessions/sbx-3'
    ]);
  });
});

describe('trackOnFirstUse (the drive browser and the file browsers tracker)', () => {
  const attached: Widget[] = [];
  afterEach(() => attached.splice(0).forEach(w => w.dispose()));

  /** A browser-like widget: a focusable listing, and a heading that takes no focus. */
  function browser(name: string): { widget: Widget; listing: HTMLElement; heading: HTMLElement } {
    const widget = new Widget();
    widget.id = name;
    const heading = document.createElement('h2');
    const listing = document.createElement('div');
    listing.tabIndex = -1;
    widget.node.append(heading, listing);
    Widget.attach(widget, document.body);
    attached.push(widget);
    return { widget, listing, heading };
  }

  async function setUp() {
    const tracker = new WidgetTracker<Widget>({ namespace: `browsers-${Math.random()}` });
    const defaults = browser('default');
    await tracker.add(defaults.widget);
    const drive = browser('drive');
    trackOnFirstUse(tracker, drive.widget);
    await Promise.resolve();
    return { tracker, defaults, drive };
  }

  const settle = () => new Promise(resolve => setTimeout(resolve, 0));

  it('leaves the default browser current until the drive browser is used', async () => {
    const { tracker, defaults, drive } = await setUp();
    expect(tracker.has(drive.widget)).toBe(false);
    expect(tracker.currentWidget).toBe(defaults.widget);
    // a press on a part that takes no focus does not make it the current browser
    drive.heading.dispatchEvent(new MouseEvent('mousedown', { bubbles: true }));
    await settle();
    expect(tracker.has(drive.widget)).toBe(false);
    expect(tracker.currentWidget).toBe(defaults.widget);
  });

  it('joins on a press on its listing, and is current once it has the focus', async () => {
    const { tracker, drive } = await setUp();
    drive.listing.dispatchEvent(new MouseEvent('mousedown', { bubbles: true }));
    drive.listing.focus();
    await settle();
    expect(tracker.has(drive.widget)).toBe(true);
    expect(tracker.currentWidget).toBe(drive.widget);
  });

  it('joins when activated visible (its sidebar tab, Show Sandbox Files), not hidden (a restore)', async () => {
    const { tracker, defaults, drive } = await setUp();
    drive.widget.hide();
    drive.widget.activate();
    await settle();
    expect(tracker.has(drive.widget)).toBe(false);
    expect(tracker.currentWidget).toBe(defaults.widget);
    drive.widget.show();
    drive.widget.activate();
    // a FileBrowser's activation focuses its listing
    drive.listing.focus();
    await settle();
    expect(tracker.currentWidget).toBe(drive.widget);
  });

  it('joins when the focus leaves another element for it (the keyboard)', async () => {
    const { tracker, defaults, drive } = await setUp();
    const elsewhere = document.createElement('input');
    defaults.widget.node.append(elsewhere);
    elsewhere.focus();
    drive.listing.focus();
    await settle();
    expect(tracker.currentWidget).toBe(drive.widget);
    expect(document.activeElement).toBe(drive.listing);
  });

  it('joins when the focus comes from nowhere, and keeps the focus', async () => {
    const { tracker, drive } = await setUp();
    (document.activeElement as HTMLElement | null)?.blur();
    drive.listing.focus();
    await settle();
    expect(tracker.currentWidget).toBe(drive.widget);
    expect(document.activeElement).toBe(drive.listing);
  });
});
