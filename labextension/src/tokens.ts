/**
 * What the panel's plugins share, as tokens: the sessions (client, model, settings and the
 * session actions) provided by the sessions plugin, and the tracker of the terminal tabs.
 */
import { IWidgetTracker } from '@jupyterlab/apputils';
import { Token } from '@lumino/coreutils';
import { IDisposable } from '@lumino/disposable';
import { ISignal } from '@lumino/signaling';

import { ISessionInfo, SandboxClient } from './api';
import { SessionsModel } from './model';
import { ISandboxSettings } from './settings';
import { SandboxTerminal } from './terminal';

/** An error shown whole in the Sandbox panel; null clears it. */
export interface IReportedError {
  title: string;
  message: string;
}

export interface ISandboxSessions {
  readonly client: SandboxClient;
  readonly model: SessionsModel;
  /** The user's settings, current (they apply when changed). */
  readonly settings: ISandboxSettings;
  /** The error the panel shows whole: set by reportError, cleared (null) after a success. */
  readonly errorChanged: ISignal<ISandboxSessions, IReportedError | null>;
  /** A session this page destroyed: what shows it (a files tab) closes. */
  readonly destroyed: ISignal<ISandboxSessions, string>;
  /**
   * A view of the sessions: the model refreshes while one is visible and stands by
   * otherwise. Dispose of the result to drop the view.
   */
  addView(isVisible: () => boolean): IDisposable;
  /** Show an error whole in the panel, and briefly as a notification. */
  reportError(title: string, message: string): void;
  clearError(): void;
  notifyError(message: string): void;
  /** The session to act on: `args.id`, or one the user picks. */
  pickSession(args: unknown, verb: string): Promise<string | null>;
  /** The session, fresh from the server; null (and a notification) when it is gone. */
  fetchSession(id: string, verb: string): Promise<ISessionInfo | null>;
  /** The New session dialog, then the session created; null if cancelled or refused. */
  newSession(): Promise<ISessionInfo | null>;
  /** Destroy after asking (the panel's and the palette's Destroy). */
  destroy(id: string): Promise<boolean>;
  /** Destroy without asking (the Running sidebar, as JupyterLab shuts a kernel down there). */
  destroyNow(id: string): Promise<void>;
  /** "+30 min": the current TTL plus EXTEND_SECONDS; a refusal is shown whole. */
  extendTtl(id: string, seconds?: number): Promise<boolean>;
  /** Ask how much longer (a duration: `30m`, `1h30m`) and extend the session by it. */
  extendTtlBy(id: string): Promise<boolean>;
  /** Pause (freeze every process) or resume a session; a refusal is shown whole. */
  setPaused(id: string, paused: boolean): Promise<boolean>;
  /** A new session from this one's state now (null when refused; the refusal is shown whole). */
  fork(id: string): Promise<ISessionInfo | null>;
}

export const ISandboxSessions = new Token<ISandboxSessions>(
  'jupyter-tai-sandbox:ISandboxSessions',
  'The sandbox sessions: client, model, settings and the session actions.'
);

/** The terminal tabs into sandbox sessions. */
export type ISandboxTerminalTracker = IWidgetTracker<SandboxTerminal>;

export const ISandboxTerminalTracker = new Token<ISandboxTerminalTracker>(
  'jupyter-tai-sandbox:ISandboxTerminalTracker',
  'The terminal tabs into sandbox sessions.'
);
