/**
 * The sandbox in JupyterLab's Running sidebar (IRunningSessionManagers), as
 * JupyterLab lists its own terminals and kernels: the open sandbox terminals, and
 * the sandbox sessions. Each item opens (or focuses) what it stands for, and shuts
 * it down: a terminal tab is closed (its command is killed), a session destroyed
 * (a sandboxed kernel's session: its kernel shut down, which destroys the session).
 */
import type { IRunningSessions } from '@jupyterlab/running';
import type { LabIcon } from '@jupyterlab/ui-components';
import { ISignal, Signal } from '@lumino/signaling';

import { ISessionInfo } from './api';
import { kernelIdOf } from './kernels';
import { IPanelState, SessionsModel, formatDuration, secondsLeft } from './model';
import { agentKeyOf, agentLabel, magicsOf, relativeNotebook } from './names';

/** The label, hover text and detail column of a session's row. */
export function sessionRow(
  session: ISessionInfo,
  state: Pick<IPanelState, 'fetchedAt' | 'kernels'>,
  now: number
): { label: string; title: string; detail: string } {
  const kernelId = kernelIdOf(session.consumer);
  const users = kernelId ? (state.kernels[kernelId] ?? []) : [];
  const serves = users.length ? users.map(u => u.path).join(', ') : '';
  const magics = magicsOf(session.consumer);
  const agent = agentKeyOf(session.consumer);
  const label = magics
    ? `${magics.name} (%sandbox${magics.notebook ? ` in ${relativeNotebook(magics.notebook)}` : ''})`
    : kernelId
      ? `${session.id} (kernel${serves ? ` of ${serves}` : ''})`
      : agent
        ? `${agentLabel(agent)} (${session.id})`
        : session.id;
  const left = secondsLeft(session, state.fetchedAt, now);
  const title = [
    `Sandbox session ${session.id}`,
    `consumer: ${session.consumer}`,
    `image: ${session.image ?? '(default)'}`,
    `isolation: ${session.isolation} · network: ${session.network} · ${session.durability}`,
    left > 0 ? `reaped in ${formatDuration(left)}` : 'reaping…'
  ].join('\n');
  return { label, title, detail: left > 0 ? formatDuration(left) : 'reaping' };
}

/** What the Running sidebar's terminal rows need of a sandbox terminal (SandboxTerminal has it). */
export interface IRunningTerminal {
  readonly id: string;
  readonly sessionId: string;
  readonly isDisposed: boolean;
  readonly title: { label: string; caption: string; changed: ISignal<any, any> };
  readonly disposed: ISignal<any, any>;
  dispose(): void;
}

export namespace SandboxTerminalsRunning {
  export interface IOptions {
    /** The open terminals (a WidgetTracker's forEach / widgetAdded). */
    forEach(fn: (terminal: IRunningTerminal) => void): void;
    widgetAdded: ISignal<any, IRunningTerminal>;
    /** Show and focus the terminal's tab. */
    activate(terminal: IRunningTerminal): void;
    icon: LabIcon;
  }
}

/** The "Sandbox Terminals" section: one row per open sandbox terminal tab. */
export class SandboxTerminalsRunning implements IRunningSessions.IManager {
  constructor(private _options: SandboxTerminalsRunning.IOptions) {
    _options.forEach(t => this._watch(t));
    _options.widgetAdded.connect((_, terminal) => {
      this._watch(terminal);
      this._changed.emit(undefined);
    });
  }

  readonly name = 'Sandbox Terminals';
  readonly shutdownLabel = 'Shut Down';
  readonly shutdownAllLabel = 'Shut Down All';
  readonly shutdownAllConfirmationText =
    'Are you sure you want to close every sandbox terminal? Their commands are killed.';

  get runningChanged(): ISignal<this, void> {
    return this._changed;
  }

  running(): IRunningSessions.IRunningItem[] {
    const items: IRunningSessions.IRunningItem[] = [];
    this._options.forEach(terminal => {
      if (terminal.isDisposed) {
        return;
      }
      items.push({
        className: 'jp-TaiSandbox-runningTerminal',
        context: terminal.sessionId,
        icon: () => this._options.icon,
        label: () => terminal.title.label,
        labelTitle: () => terminal.title.caption,
        open: () => this._options.activate(terminal),
        shutdown: () => terminal.dispose()
      });
    });
    return items;
  }

  refreshRunning(): void {
    this._changed.emit(undefined);
  }

  shutdownAll(): void {
    const all: IRunningTerminal[] = [];
    this._options.forEach(t => all.push(t));
    all.forEach(t => t.dispose());
  }

  private _watch(terminal: IRunningTerminal): void {
    const emit = () => this._changed.emit(undefined);
    terminal.title.changed.connect(emit);
    terminal.disposed.connect(emit);
  }

  private _changed = new Signal<this, void>(this);
}

export namespace SandboxSessionsRunning {
  export interface IOptions {
    model: SessionsModel;
    /** Show the session in the Sandbox panel. */
    reveal(id: string): void;
    /** Destroy a session (no question asked, as JupyterLab shuts a kernel down from here). */
    destroy(id: string): Promise<void>;
    /** Shut a sandboxed kernel down (its session goes with it). */
    shutdownKernel(kernelId: string): Promise<void>;
    icon: LabIcon;
    now?: () => number;
  }
}

/** The "Sandbox Sessions" section: one row per live session of the last refresh. */
export class SandboxSessionsRunning implements IRunningSessions.IManager {
  constructor(private _options: SandboxSessionsRunning.IOptions) {
    _options.model.changed.connect(() => this._changed.emit(undefined));
  }

  readonly name = 'Sandbox Sessions';
  readonly shutdownLabel = (item: IRunningSessions.IRunningItem) =>
    item.className?.includes('jp-mod-kernel') ? 'Shut Down Kernel' : 'Destroy';
  readonly shutdownAllLabel = 'Destroy All';
  readonly shutdownAllConfirmationText =
    'Are you sure you want to destroy every sandbox session? Their commands stop, sandboxed kernels ' +
    'shut down, and ephemeral workspaces are deleted.';

  get runningChanged(): ISignal<this, void> {
    return this._changed;
  }

  running(): IRunningSessions.IRunningItem[] {
    const state = this._options.model.state;
    if (state.connection !== 'ok') {
      return [];
    }
    const now = this._options.now ?? Date.now;
    return state.sessions.map(session => {
      const kernelId = kernelIdOf(session.consumer);
      const row = () => sessionRow(session, this._options.model.state, now());
      return {
        className: kernelId ? 'jp-TaiSandbox-runningSession jp-mod-kernel' : 'jp-TaiSandbox-runningSession',
        context: session.id,
        icon: () => this._options.icon,
        label: () => row().label,
        labelTitle: () => row().title,
        detail: () => row().detail,
        open: () => this._options.reveal(session.id),
        shutdown: () => void this.shutdown(session.id)
      };
    });
  }

  /** Destroy the session, or shut its kernel down; either way it leaves the list. */
  async shutdown(id: string): Promise<void> {
    const session = this._options.model.find(id);
    const kernelId = kernelIdOf(session?.consumer);
    if (kernelId) {
      await this._options.shutdownKernel(kernelId);
    } else {
      await this._options.destroy(id);
    }
    this._options.model.removeLocally(id);
  }

  refreshRunning(): void {
    void this._options.model.refresh();
  }

  shutdownAll(): void {
    const ids = this._options.model.state.sessions.map(s => s.id);
    void Promise.all(ids.map(id => this.shutdown(id).catch(() => undefined))).then(
      () => void this._options.model.refresh()
    );
  }

  private _changed = new Signal<this, void>(this);
}
