/**
 * The sandbox sessions as the plugins share them (ISandboxSessions): the client, the polled
 * model, the settings, and the actions on a session that ask, notify and report.
 */
import { Dialog, InputDialog, Notification, showDialog } from '@jupyterlab/apputils';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

import { ISessionInfo, SandboxClient } from './api';
import { NewSessionBody } from './dialogs';
import { EXTEND_SECONDS, extendedTtl } from './kernels';
import { DURATION_HINT, DurationError, durationWords, parseDuration } from './duration';
import { SessionsModel, describeError } from './model';
import { sessionName } from './names';
import { SandboxAPIError } from './request';
import { DEFAULT_SETTINGS, ISandboxSettings } from './settings';
import { ISessionForm, SpecFormError, buildSpec, defaultForm } from './spec';
import { IReportedError, ISandboxSessions } from './tokens';

/**
 * Seconds between two fetches of the sessions' recent resource use while a view shows (one GET usage for
 * all of them; the server samples every UsageHistory.interval_seconds, 5 s by default).
 */
export const USAGE_SECONDS = 5;

export namespace SandboxSessions {
  export interface IOptions {
    client: SandboxClient;
    /** Show the Sandbox panel (a notification's "Show"). */
    showPanel: () => void;
    usageInterval?: number;
  }
}

export class SandboxSessions implements ISandboxSessions {
  constructor(options: SandboxSessions.IOptions) {
    this.client = options.client;
    this._showPanel = options.showPanel;
    this.model = new SessionsModel({
      client: this.client,
      interval: this._settings.pollIntervalSeconds,
      standby: () => !this.anyViewVisible(),
      usageInterval: options.usageInterval ?? USAGE_SECONDS
    });
    this.model.notice.connect((_, notice) => {
      const shown = {
        autoClose: notice.level === 'error' ? 10000 : 5000,
        actions: notice.showPanel ? [{ label: 'Show', callback: () => this._showPanel() }] : undefined
      };
      if (notice.level === 'error') {
        Notification.error(notice.message, shown);
      } else if (notice.level === 'success') {
        Notification.success(notice.message, shown);
      } else {
        Notification.info(notice.message, shown);
      }
    });
  }

  readonly client: SandboxClient;
  readonly model: SessionsModel;

  get settings(): ISandboxSettings {
    return this._settings;
  }

  /** Apply new settings (the refresh interval at once, the rest at their next use). */
  setSettings(settings: ISandboxSettings): void {
    this._settings = settings;
    this.model.setInterval(settings.pollIntervalSeconds);
  }

  get errorChanged(): Signal<this, IReportedError | null> {
    return this._errorChanged;
  }

  get destroyed(): Signal<this, string> {
    return this._destroyed;
  }

  addView(isVisible: () => boolean): IDisposable {
    this._views.add(isVisible);
    return new DisposableDelegate(() => this._views.delete(isVisible));
  }

  /** A view of the sessions is visible (the model refreshes; otherwise it stands by). */
  anyViewVisible(): boolean {
    for (const isVisible of this._views) {
      if (isVisible()) {
        return true;
      }
    }
    return false;
  }

  reportError(title: string, message: string): void {
    this._errorChanged.emit({ title, message });
    Notification.error(`${title} ${message}`, {
      autoClose: 10000,
      actions: [
        {
          label: 'Show',
          caption: 'Show the whole message in the Sandbox panel',
          callback: () => this._showPanel()
        }
      ]
    });
  }

  clearError(): void {
    this._errorChanged.emit(null);
  }

  notifyError(message: string): void {
    Notification.error(message, { autoClose: 10000 });
  }

  async pickSession(args: unknown, verb: string): Promise<string | null> {
    const given = (args as { id?: unknown } | null | undefined)?.id;
    if (typeof given === 'string' && given) {
      return given;
    }
    const state = await this.model.refresh();
    if (state.connection !== 'ok') {
      this.reportError(`Cannot ${verb}:`, state.problem ?? state.status?.message ?? 'the sandbox is off.');
      return null;
    }
    if (!state.sessions.length) {
      Notification.info('There is no sandbox session yet: create one first.', { autoClose: 5000 });
      return null;
    }
    const labels = state.sessions.map(s => {
      const name = sessionName(s, state.kernels);
      const called = name.label === s.id ? s.consumer : `${name.label}${name.sub ? ` in ${name.sub}` : ''}`;
      return `${s.id} (${called}, ${s.image ?? 'default image'})`;
    });
    const result = await InputDialog.getItem({
      title: `Session to ${verb}`,
      items: labels,
      current: 0
    });
    if (!result.button.accept || result.value === null) {
      return null;
    }
    return state.sessions[labels.indexOf(result.value)]?.id ?? null;
  }

  async fetchSession(id: string, verb: string): Promise<ISessionInfo | null> {
    try {
      return await this.client.getSession(id);
    } catch (error) {
      if (error instanceof SandboxAPIError && error.status === 404) {
        this.notifyError(`Cannot ${verb}: session ${id} is gone (destroyed or reaped).`);
        this.model.removeLocally(id);
      } else {
        this.notifyError(`Cannot ${verb}: ${describeError(error)}`);
      }
      return null;
    }
  }

  async newSession(initial?: ISessionForm): Promise<ISessionInfo | null> {
    const model = this.model;
    const state = model.state.connection === 'ok' ? model.state : await model.refresh();
    if (state.connection !== 'ok') {
      this.reportError(
        'Cannot create a session:',
        state.problem ?? state.status?.message ?? 'the sandbox is off.'
      );
      return null;
    }
    const body = new NewSessionBody(initial ?? defaultForm(this._settings), state.status);
    const result = await showDialog({
      title: 'New sandbox session',
      body,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Create' })],
      focusNodeSelector: 'input'
    });
    if (!result.button.accept || !result.value) {
      return null;
    }
    let spec;
    try {
      spec = buildSpec(result.value);
    } catch (error) {
      if (error instanceof SpecFormError) {
        this.notifyError(error.message);
        return this.newSession(result.value);
      }
      throw error;
    }
    try {
      const info = await this.client.createSession(spec);
      this.clearError();
      model.addLocally(info);
      Notification.success(`Sandbox session ${info.id} created.`, { autoClose: 3000 });
      void model.refreshSoon();
      return info;
    } catch (error) {
      this.reportError('Could not create the session:', describeError(error));
      return null;
    }
  }

  async destroy(id: string): Promise<boolean> {
    const model = this.model;
    const info = model.find(id);
    const persistent = info?.durability === 'persistent';
    const result = await showDialog({
      title: 'Destroy sandbox session?',
      body:
        `Session ${id} will be destroyed and its running commands stopped.` +
        (persistent
          ? ` Its persistent workspace "${info?.workspace_key}" is kept unless you tick the box.`
          : ' Its workspace is deleted.'),
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Destroy' })],
      checkbox: persistent ? { label: 'Also delete the persistent workspace', checked: false } : null
    });
    if (!result.button.accept) {
      return false;
    }
    try {
      await this.client.destroySession(id, persistent && !!result.isChecked);
    } catch (error) {
      if (error instanceof SandboxAPIError && error.status === 404) {
        Notification.info(`Session ${id} was already gone.`, { autoClose: 5000 });
        model.removeLocally(id);
        return true;
      }
      this.notifyError(`Could not destroy session ${id}: ${describeError(error)}`);
      return false;
    }
    model.removeLocally(id);
    this._destroyed.emit(id);
    Notification.success(`Sandbox session ${id} destroyed.`, { autoClose: 3000 });
    void model.refreshSoon();
    return true;
  }

  async destroyNow(id: string): Promise<void> {
    try {
      await this.client.destroySession(id);
    } catch (error) {
      if (!(error instanceof SandboxAPIError && error.status === 404)) {
        this.notifyError(`Could not destroy session ${id}: ${describeError(error)}`);
        throw error;
      }
    }
    this._destroyed.emit(id);
  }

  async setPaused(id: string, paused: boolean): Promise<boolean> {
    try {
      const updated = await this.client.setPaused(id, paused);
      this.clearError();
      this.model.updateLocally(updated);
      Notification.success(
        paused
          ? `Sandbox session ${id} is paused: nothing in it runs until you resume it (its time still runs).`
          : `Sandbox session ${id} runs again.`,
        { autoClose: 3000 }
      );
      return true;
    } catch (error) {
      this.reportError(`Could not ${paused ? 'pause' : 'resume'} session ${id}:`, describeError(error));
      return false;
    } finally {
      void this.model.refreshSoon();
    }
  }

  async fork(id: string): Promise<ISessionInfo | null> {
    try {
      const made = await this.client.fork(id);
      this.clearError();
      Notification.success(`Sandbox session ${made.id} forked from ${id}: the two now run on apart.`, {
        autoClose: 3000
      });
      return made;
    } catch (error) {
      this.reportError(`Could not fork session ${id}:`, describeError(error));
      return null;
    } finally {
      void this.model.refreshSoon();
    }
  }

  async extendTtlBy(id: string): Promise<boolean> {
    let initial = '30m';
    for (;;) {
      const result = await InputDialog.getText({
        title: `Extend session ${id} by`,
        label: `How much longer: ${DURATION_HINT}`,
        text: initial,
        okLabel: 'Extend'
      });
      if (!result.button.accept || result.value === null) {
        return false;
      }
      try {
        return await this.extendTtl(id, parseDuration(result.value, 'The extension'));
      } catch (error) {
        if (!(error instanceof DurationError)) {
          throw error;
        }
        this.notifyError(error.message);
        initial = result.value;
      }
    }
  }

  async extendTtl(id: string, seconds: number = EXTEND_SECONDS): Promise<boolean> {
    const info = await this.fetchSession(id, 'extend the session');
    if (!info) {
      return false;
    }
    const ttl = extendedTtl(info, seconds);
    try {
      const updated = await this.client.setTtl(id, ttl);
      this.clearError();
      this.model.updateLocally(updated);
      Notification.success(`Sandbox session ${id} now ends ${durationWords(seconds)} later.`, {
        autoClose: 3000
      });
      return true;
    } catch (error) {
      this.reportError(`Could not extend session ${id}:`, describeError(error));
      return false;
    } finally {
      void this.model.refreshSoon();
    }
  }

  private _settings: ISandboxSettings = { ...DEFAULT_SETTINGS };
  private _showPanel: () => void;
  private _views = new Set<() => boolean>();
  private _errorChanged = new Signal<this, IReportedError | null>(this);
  private _destroyed = new Signal<this, string>(this);
}
