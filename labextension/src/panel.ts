/**
 * The left sidebar (JupyterLab's SidePanel: a header, a toolbar, the content):
 * the kind row, the session list (kept current by the
 * model's poll, time left counted down every second) and the per-session actions.
 */
import {
  SidePanel,
  Toolbar,
  ToolbarButton,
  LabIcon,
  addIcon,
  caretDownIcon,
  closeIcon,
  folderIcon,
  refreshIcon,
  terminalIcon
} from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Panel, Widget } from '@lumino/widgets';

import { IListeningPort, ISessionInfo } from './api';
import { canEditEgress, egressFields } from './egress';
import { button } from './files';
import { agentKeyOf, magicsOf, relativeNotebook, sessionName } from './names';
import {
  IPanelState,
  SessionsModel,
  createBlockedReason,
  formatDuration,
  isolationWarning,
  secondsLeft,
  statusLine
} from './model';
import {
  EXTEND_SECONDS,
  extendBlockedReason,
  kernelIdOf,
  kernelServesText,
  usageText,
  usageTitle
} from './kernels';
import { PORTS_SECONDS, fillPortsList } from './previews';
import { SandboxAPIError } from './request';
import { fillSparks, makeSparks } from './sparks';

export namespace SandboxPanel {
  export interface IActions {
    newSession(): void;
    openTerminal(id: string): void;
    openFiles(id: string): void;
    destroy(id: string): void;
    /** Add EXTEND_SECONDS to the session's TTL (PATCH); resolves once answered. */
    extendTtl(id: string): Promise<void>;
    /** Ask for a duration (`1h30m`) and add it to the session's TTL. */
    extendTtlBy(id: string): void;
    /** Pause or resume the session; resolves once answered. */
    setPaused(id: string, paused: boolean): Promise<void>;
    /** Fork the session; resolves once answered. */
    fork(id: string): Promise<void>;
    /** Open a document of the server (the notebook a kernel serves). */
    openDocument(path: string): void;
    /** Show the session's egress policy in a dialog that changes it (PATCH). */
    editEgress?(id: string): void;
    /** Save the session's transcript (its commands and output) as a notebook and open it; resolves once done. */
    saveTranscript?(id: string): Promise<unknown>;
    /** GET sessions/{id}/ports: the session's listening ports (the "Ports" list shows where given). */
    listPorts?(id: string): Promise<IListeningPort[]>;
    /** Open the preview of a session's port in a JupyterLab tab (`ownOrigin`: it is served on an origin of its own). */
    openPreview?(id: string, port: number, ownOrigin?: boolean): void;
  }
  export interface IOptions {
    model: SessionsModel;
    actions: IActions;
  }
}

export class SandboxPanel extends SidePanel {
  constructor(options: SandboxPanel.IOptions) {
    super({ content: new Panel(), header: new Panel(), toolbar: new Toolbar() });
    this._model = options.model;
    this._actions = options.actions;
    this.id = 'jp-tai-sandbox-panel';
    this.addClass('jp-TaiSandbox-panel');
    this.title.caption = 'Sandbox sessions';

    const heading = new Widget({ node: document.createElement('h2') });
    heading.node.textContent = 'Sandbox sessions';
    heading.addClass('jp-TaiSandbox-title');
    this.header.addWidget(heading);

    this._newButton = this._makeNewButton(NEW_TOOLTIP);
    this.toolbar.addItem('new-session', this._newButton);
    this.toolbar.addItem('spacer', Toolbar.createSpacerItem());
    this.toolbar.addItem(
      'refresh',
      new ToolbarButton({
        icon: refreshIcon,
        tooltip: 'Refresh the status and the sessions',
        className: 'jp-TaiSandbox-refresh',
        onClick: () => void this._model.refreshSoon()
      })
    );

    const body = new Widget();
    body.addClass('jp-TaiSandbox-body');
    this._status = document.createElement('div');
    this._status.className = 'jp-TaiSandbox-status';
    this._status.setAttribute('role', 'status');
    this._statusText = document.createElement('span');
    this._statusText.className = 'jp-TaiSandbox-statusText';
    // why New session is off, or that sessions run with no isolation: where the user decides
    this._notice = document.createElement('div');
    this._notice.className = 'jp-TaiSandbox-notice';
    this._notice.hidden = true;
    this._status.append(this._statusText, this._notice);
    this._error = document.createElement('div');
    this._error.className = 'jp-TaiSandbox-error';
    this._error.setAttribute('role', 'alert');
    this._error.hidden = true;
    this._list = document.createElement('ul');
    this._list.className = 'jp-TaiSandbox-sessions';
    this._empty = document.createElement('div');
    this._empty.className = 'jp-TaiSandbox-empty';
    body.node.append(this._status, this._error, this._list, this._empty);
    this.content.addWidget(body);

    this._model.changed.connect(this._render, this);
    this._render();
  }

  /**
   * Show a failure in the panel, whole and wrapping (a notification would cut
   * it): e.g. the server refusing a create under the isolation floor.
   */
  showError(title: string, message: string): void {
    const heading = document.createElement('div');
    heading.className = 'jp-TaiSandbox-errorTitle';
    heading.textContent = title;
    const text = document.createElement('div');
    text.className = 'jp-TaiSandbox-errorMessage';
    text.textContent = message;
    const dismiss = button('Dismiss', 'Hide this message', () => this.clearError());
    dismiss.classList.add('jp-TaiSandbox-dismiss');
    this._error.replaceChildren(heading, text, dismiss);
    this._error.hidden = false;
  }

  /** Scroll a session's row into view and mark it for a moment (from the Running sidebar). */
  revealSession(id: string): void {
    const item = this._items.get(id);
    if (!item) {
      return;
    }
    item.scrollIntoView({ block: 'nearest' });
    item.classList.add('jp-mod-revealed');
    window.setTimeout(() => item.classList.remove('jp-mod-revealed'), 2000);
  }

  clearError(): void {
    this._error.hidden = true;
    this._error.replaceChildren();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearInterval(this._timer);
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this._model.refreshSoon();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._timer = window.setInterval(() => this._tick(), 1000);
  }

  protected onBeforeDetach(msg: Message): void {
    window.clearInterval(this._timer);
    super.onBeforeDetach(msg);
  }

  private _render(): void {
    const state = this._model.state;
    this._statusText.textContent = statusLine(state);
    this._status.dataset.connection = state.connection;
    const ok = state.connection === 'ok';
    const blocked = ok ? createBlockedReason(state.status) : null;
    const warning = ok ? isolationWarning(state.status) : null;
    this._notice.hidden = !blocked && !warning;
    this._notice.textContent = blocked ? `New session is off: ${blocked}` : (warning ?? '');
    const warned = state.status?.max_isolation === 'none' ? 'no-isolation' : 'isolation-note';
    this._notice.dataset.kind = blocked ? 'blocked' : warning ? warned : '';
    this._setNewButton(ok && !blocked, blocked ? `New session is off: ${blocked}` : NEW_TOOLTIP);

    const seen = new Set<string>();
    let previous: HTMLElement | null = null;
    for (const session of state.sessions) {
      seen.add(session.id);
      let item = this._items.get(session.id);
      if (!item) {
        item = this._createItem(session);
        this._items.set(session.id, item);
      }
      this._fill(item, session, state);
      const want: ChildNode | null = previous ? previous.nextSibling : this._list.firstChild;
      if (want !== item) {
        this._list.insertBefore(item, want);
      }
      previous = item;
    }
    for (const [id, item] of this._items) {
      if (!seen.has(id)) {
        item.remove();
        this._items.delete(id);
        this._portsFetched.delete(id);
        this._portsUnsupported.delete(id);
      }
    }
    this._empty.textContent =
      state.connection === 'ok' && state.sessions.length === 0 ? 'No sessions yet.' : '';
  }

  private _makeNewButton(tooltip: string): ToolbarButton {
    return new ToolbarButton({
      icon: addIcon,
      label: 'New session',
      tooltip,
      className: 'jp-TaiSandbox-new',
      onClick: () => this._actions.newSession()
    });
  }

  /** Enable or disable New session; a new tooltip needs a new button (ToolbarButton has no setter). */
  private _setNewButton(enabled: boolean, tooltip: string): void {
    if (tooltip !== this._newTooltip) {
      this._newTooltip = tooltip;
      const old = this._newButton;
      this._newButton = this._makeNewButton(tooltip);
      old.dispose();
      this.toolbar.insertItem(0, 'new-session', this._newButton);
    }
    this._newButton.enabled = enabled;
  }

  private _tick(): void {
    const state = this._model.state;
    for (const session of state.sessions) {
      const item = this._items.get(session.id);
      const left = item?.querySelector('.jp-TaiSandbox-timeLeft');
      if (left) {
        left.textContent = timeLeftText(session, state);
      }
      const meta = item?.querySelector('.jp-TaiSandbox-sessionMeta');
      if (meta) {
        meta.textContent = rowMetaText(session, state);
      }
      // an open session's ports, listed again while the panel shows it
      const fetched = this._portsFetched.get(session.id) ?? 0;
      if (item?.dataset.expanded === 'true' && this.isVisible && Date.now() - fetched >= PORTS_SECONDS * 1000) {
        void this.refreshPorts(session.id);
      }
    }
  }

  /**
   * A session's row, compact as JupyterLab's Running panel: one line (its name, its
   * provider and time left, Terminal / Files / Destroy on hover or focus); a click or
   * Enter opens its details and the rest of its actions below.
   */
  private _createItem(session: ISessionInfo): HTMLElement {
    const item = document.createElement('li');
    item.className = 'jp-TaiSandbox-session';
    item.dataset.sessionId = session.id;

    const row = document.createElement('div');
    row.className = 'jp-TaiSandbox-sessionRow';
    row.tabIndex = 0;
    row.setAttribute('role', 'button');
    row.setAttribute('aria-expanded', 'false');
    const caret = caretDownIcon.element({ className: 'jp-TaiSandbox-caret', tag: 'span' });
    const dot = document.createElement('span');
    dot.className = 'jp-TaiSandbox-stateDot';
    const label = document.createElement('span');
    label.className = 'jp-TaiSandbox-sessionLabel';
    const sub = document.createElement('span');
    sub.className = 'jp-TaiSandbox-sessionSub';
    const badges = document.createElement('span');
    badges.className = 'jp-TaiSandbox-badges';
    const meta = document.createElement('span');
    meta.className = 'jp-TaiSandbox-sessionMeta';
    const rowActions = document.createElement('span');
    rowActions.className = 'jp-TaiSandbox-rowActions';
    const terminal = iconButton(terminalIcon, 'Open a terminal in this session', 'jp-TaiSandbox-openTerminal', () =>
      this._actions.openTerminal(session.id)
    );
    const files = iconButton(folderIcon, "Browse this session's workspace", 'jp-TaiSandbox-openFiles', () =>
      this._actions.openFiles(session.id)
    );
    const destroy = iconButton(closeIcon, 'Destroy this session', 'jp-TaiSandbox-destroy', () =>
      this._actions.destroy(session.id)
    );
    destroy.classList.add('jp-mod-warn');
    rowActions.append(terminal, files, destroy);
    row.append(caret, dot, label, sub, badges, meta, rowActions);
    const toggle = () => this._setExpanded(item, item.dataset.expanded !== 'true');
    row.addEventListener('click', toggle);
    row.addEventListener('keydown', event => {
      if ((event.key === 'Enter' || event.key === ' ') && event.target === row) {
        event.preventDefault();
        toggle();
      }
    });

    // under the line: CPU, memory and disk over the last minutes, and what the session serves
    const sparks = makeSparks();

    const body = document.createElement('div');
    body.className = 'jp-TaiSandbox-sessionBody';
    body.hidden = true;
    const id = document.createElement('div');
    id.className = 'jp-TaiSandbox-sessionId';
    const idText = document.createElement('span');
    idText.textContent = session.id;
    idText.title = session.workspace;
    id.append(idText);
    const kernelId = kernelIdOf(session.consumer);
    if (kernelId) {
      item.classList.add('jp-mod-kernel');
      item.dataset.kernelId = kernelId;
      const badge = document.createElement('span');
      badge.className = 'jp-TaiSandbox-badge jp-TaiSandbox-kernelBadge';
      badge.textContent = 'kernel';
      badge.title = `The session of sandboxed kernel ${kernelId}`;
      badges.append(badge);
    }
    const agent = agentKeyOf(session.consumer);
    if (agent) {
      item.classList.add('jp-mod-agent');
      item.dataset.agent = agent;
      const badge = document.createElement('span');
      badge.className = 'jp-TaiSandbox-badge jp-TaiSandbox-agentBadge';
      badge.textContent = 'agent';
      badge.title = `The session of coding agent "${agent}": its agent process, files and terminals run here`;
      badges.append(badge);
    }
    const magics = magicsOf(session.consumer);
    if (magics) {
      item.classList.add('jp-mod-magics');
      const badge = document.createElement('span');
      badge.className = 'jp-TaiSandbox-badge jp-TaiSandbox-magicsBadge';
      badge.textContent = '%sandbox';
      badge.title = `Session "${magics.name}" of the %sandbox magics${magics.notebook ? ` in ${magics.notebook}` : ''}`;
      id.append(' ', badge);
    }
    const kernelLine = document.createElement('div');
    kernelLine.className = 'jp-TaiSandbox-kernelServes';
    kernelLine.hidden = !kernelId;
    const details = document.createElement('div');
    details.className = 'jp-TaiSandbox-sessionDetails';
    const usage = document.createElement('div');
    usage.className = 'jp-TaiSandbox-usage';
    usage.hidden = true;
    const timeRow = document.createElement('div');
    timeRow.className = 'jp-TaiSandbox-timeRow';
    const left = document.createElement('span');
    left.className = 'jp-TaiSandbox-timeLeft';
    const extend = button('+30 min', EXTEND_TOOLTIP, () => {
      extend.disabled = true;
      extend.dataset.busy = 'true';
      void this._actions.extendTtl(session.id).finally(() => {
        delete extend.dataset.busy;
        this._fillExtend(extend, this._model.find(session.id) ?? session, this._model.state);
      });
    });
    extend.classList.add('jp-TaiSandbox-extend');
    const extendBy = button('Extend by…', EXTEND_BY_TOOLTIP, () => this._actions.extendTtlBy(session.id));
    extendBy.classList.add('jp-TaiSandbox-extendBy');
    timeRow.append(left, extend, extendBy);

    const actions = document.createElement('div');
    actions.className = 'jp-TaiSandbox-sessionActions';
    const pause = button('Pause', PAUSE_TOOLTIP, () => {
      const current = this._model.find(session.id) ?? session;
      pause.disabled = true;
      void this._actions.setPaused(session.id, !current.paused).finally(() => {
        pause.disabled = false;
        this._fillPause(pause, this._model.find(session.id) ?? session, this._model.state);
      });
    });
    pause.classList.add('jp-TaiSandbox-pause');
    const fork = button('Fork', FORK_TOOLTIP, () => {
      fork.disabled = true;
      void this._actions.fork(session.id).finally(() => {
        fork.disabled = false;
      });
    });
    fork.classList.add('jp-TaiSandbox-fork');
    const egress = button('Egress policy…', EGRESS_TOOLTIP, () => this._actions.editEgress?.(session.id));
    egress.classList.add('jp-TaiSandbox-egress');
    egress.hidden = true;
    const transcript = button('Save transcript', TRANSCRIPT_TOOLTIP, () => {
      transcript.disabled = true;
      void Promise.resolve(this._actions.saveTranscript?.(session.id)).finally(() => {
        transcript.disabled = false;
      });
    });
    transcript.classList.add('jp-TaiSandbox-saveTranscript');
    transcript.hidden = !this._actions.saveTranscript;
    actions.append(pause, fork, egress, transcript);

    const ports = document.createElement('div');
    ports.className = 'jp-TaiSandbox-ports';
    // shown once the server answers a listing (a session that cannot list its ports keeps it hidden)
    ports.hidden = true;
    const portsHead = document.createElement('div');
    portsHead.className = 'jp-TaiSandbox-portsHead';
    const portsTitle = document.createElement('span');
    portsTitle.className = 'jp-TaiSandbox-fieldLabel';
    portsTitle.textContent = 'Ports';
    const portsRefresh = iconButton(refreshIcon, 'List the listening ports again', 'jp-TaiSandbox-refreshPorts', () =>
      void this.refreshPorts(session.id)
    );
    portsHead.append(portsTitle, portsRefresh);
    const portsList = document.createElement('ul');
    portsList.className = 'jp-TaiSandbox-portsList';
    ports.append(portsHead, portsList);

    body.append(id, kernelLine, details, usage, timeRow, actions, ports);
    item.append(row, sparks, body);
    return item;
  }

  /** Open or close a session's details (kept across refreshes). */
  private _setExpanded(item: HTMLElement, expanded: boolean): void {
    item.dataset.expanded = String(expanded);
    item.classList.toggle('jp-mod-expanded', expanded);
    (item.querySelector('.jp-TaiSandbox-sessionBody') as HTMLElement).hidden = !expanded;
    item.querySelector('.jp-TaiSandbox-sessionRow')?.setAttribute('aria-expanded', String(expanded));
    const id = item.dataset.sessionId;
    if (expanded && id) {
      void this.refreshPorts(id);
    }
  }

  /**
   * List a session's ports again (on expand, on its refresh button, and every PORTS_SECONDS while
   * its details show); resolves once its list shows the answer.
   */
  async refreshPorts(id: string): Promise<void> {
    const listPorts = this._actions.listPorts;
    const item = this._items.get(id);
    if (!listPorts || !item || this._portsBusy.has(id) || this._portsUnsupported.has(id)) {
      return;
    }
    this._portsBusy.add(id);
    this._portsFetched.set(id, Date.now());
    const section = item.querySelector('.jp-TaiSandbox-ports') as HTMLElement;
    const list = item.querySelector('.jp-TaiSandbox-portsList') as HTMLElement;
    const open = (port: number, listed?: IListeningPort) =>
      this._actions.openPreview?.(id, port, typeof listed?.origin === 'string');
    try {
      const ports = await listPorts(id);
      fillPortsList(list, ports, null, open);
      section.hidden = false;
    } catch (error) {
      if (error instanceof SandboxAPIError && error.error === 'SandboxUnsupportedError') {
        // its provider cannot (a local session: its /proc/net is the host's): no Ports, not asked again
        this._portsUnsupported.add(id);
        section.hidden = true;
      } else {
        fillPortsList(list, null, error instanceof Error ? error.message : String(error), open);
        section.hidden = false;
      }
    } finally {
      this._portsBusy.delete(id);
      this._portsFetched.set(id, Date.now());
    }
  }

  /** The one line: name, notebook, provider and state, time left. */
  private _fillRow(item: HTMLElement, session: ISessionInfo, state: IPanelState): void {
    const name = sessionName(session, state.kernels);
    const label = item.querySelector('.jp-TaiSandbox-sessionLabel') as HTMLElement;
    // a coding agent's line: its key (the "agent" badge beside it says the rest, in a narrow sidebar)
    label.textContent = name.origin === 'agent' ? (agentKeyOf(session.consumer) ?? name.label) : name.label;
    const sub = item.querySelector('.jp-TaiSandbox-sessionSub') as HTMLElement;
    // the notebook's name on the line (a narrow sidebar), its path in the tooltip
    sub.textContent = name.sub.split('/').pop() ?? '';
    sub.title = name.sub;
    sub.hidden = !name.sub;
    const phase = rowPhase(session, state);
    const dot = item.querySelector('.jp-TaiSandbox-stateDot') as HTMLElement;
    dot.dataset.state = phase;
    (item.querySelector('.jp-TaiSandbox-sessionMeta') as HTMLElement).textContent = rowMetaText(session, state);
    (item.querySelector('.jp-TaiSandbox-sessionRow') as HTMLElement).title = [
      name.label === session.id ? session.id : `${name.label} (${session.id})`,
      ...(name.sub ? [`notebook: ${magicsOf(session.consumer)?.notebook ?? name.sub}`] : []),
      `${session.kind} · isolation ${session.isolation} · network ${session.network} · ${session.durability}`,
      phase === 'paused' ? 'paused' : timeLeftText(session, state),
      'Click for the details and more actions'
    ].join('\n');
  }

  private _fill(item: HTMLElement, session: ISessionInfo, state: IPanelState): void {
    this._fillRow(item, session, state);
    const details = item.querySelector('.jp-TaiSandbox-sessionDetails') as HTMLElement;
    const magics = magicsOf(session.consumer);
    const fields: [string, string, string?][] = [
      ...(magics
        ? ([
            ['%sandbox name', magics.name],
            ['notebook', magics.notebook ? relativeNotebook(magics.notebook) : '—']
          ] as [string, string][])
        : []),
      // a magics label repeats the name and notebook above, percent-encoded: whole in the tooltip
      ['consumer', magics ? `${session.consumer.slice(0, session.consumer.lastIndexOf('/magics:'))}/magics:…` : session.consumer],
      ['image', session.image ?? '(default)'],
      ['durability', session.durability],
      ['workspace key', session.workspace_key ?? '—'],
      ['network', session.network],
      ['isolation', session.isolation],
      ...egressFields(session, state.status)
    ];
    details.replaceChildren(
      ...fields.map(([label, value, title]) => {
        const span = document.createElement('span');
        span.className = 'jp-TaiSandbox-field';
        span.dataset.field = label;
        const l = document.createElement('span');
        l.className = 'jp-TaiSandbox-fieldLabel';
        l.textContent = `${label}: `;
        const v = document.createElement('span');
        v.textContent = value;
        if (label === 'consumer') {
          v.title = session.consumer;
        } else if (title) {
          v.title = title;
        }
        span.append(l, v);
        return span;
      })
    );
    const kernelId = kernelIdOf(session.consumer);
    if (kernelId) {
      this._fillKernel(item.querySelector('.jp-TaiSandbox-kernelServes') as HTMLElement, kernelId, state);
    }
    const usage = item.querySelector('.jp-TaiSandbox-usage') as HTMLElement;
    const measured = state.usage[session.id];
    const text = usageText(measured);
    usage.hidden = !text;
    usage.textContent = text ? `usage: ${text}` : '';
    usage.title = usageTitle(measured);
    fillSparks(item.querySelector('.jp-TaiSandbox-sparks') as HTMLElement, state.history[session.id], state.kernels);
    (item.querySelector('.jp-TaiSandbox-timeLeft') as HTMLElement).textContent = timeLeftText(
      session,
      state
    );
    this._fillExtend(item.querySelector('.jp-TaiSandbox-extend') as HTMLButtonElement, session, state);
    this._fillPause(item.querySelector('.jp-TaiSandbox-pause') as HTMLButtonElement, session, state);
    (item.querySelector('.jp-TaiSandbox-fork') as HTMLButtonElement).hidden = !state.status?.forkable;
    (item.querySelector('.jp-TaiSandbox-egress') as HTMLButtonElement).hidden =
      !this._actions.editEgress || !canEditEgress(session, state.status);
    item.classList.toggle('jp-mod-paused', !!session.paused);
  }

  /** Pause or Resume as the session is; hidden where the provider cannot pause. */
  private _fillPause(pause: HTMLButtonElement, session: ISessionInfo, state: IPanelState): void {
    pause.hidden = !state.status?.pausable;
    pause.textContent = session.paused ? 'Resume' : 'Pause';
    pause.title = session.paused ? RESUME_TOOLTIP : PAUSE_TOOLTIP;
  }

  /** "+30 min" is off, saying why, when the TTL it would ask for is over the operator's maximum. */
  private _fillExtend(extend: HTMLButtonElement, session: ISessionInfo, state: IPanelState): void {
    if (extend.dataset.busy) {
      return;
    }
    const reason = extendBlockedReason(session, state.status?.policy?.max_ttl_seconds, EXTEND_SECONDS);
    extend.disabled = !!reason;
    extend.title = reason ?? EXTEND_TOOLTIP;
    if (reason) {
      extend.dataset.blocked = 'max-ttl';
    } else {
      delete extend.dataset.blocked;
    }
  }

  /** `serves: <notebook>` (a link that opens it) under a kernel session's id. */
  private _fillKernel(line: HTMLElement, kernelId: string, state: IPanelState): void {
    const users = state.kernels[kernelId] ?? [];
    const key = JSON.stringify(users);
    if (line.dataset.users === key) {
      return;
    }
    line.dataset.users = key;
    const label = document.createElement('span');
    label.className = 'jp-TaiSandbox-fieldLabel';
    label.textContent = 'serves: ';
    line.replaceChildren(label);
    if (!users.length) {
      const none = document.createElement('span');
      none.textContent = kernelServesText(users);
      line.append(none);
      return;
    }
    users.forEach((user, i) => {
      const link = document.createElement('a');
      link.className = 'jp-TaiSandbox-notebook';
      link.href = '#';
      link.dataset.path = user.path;
      link.textContent = kernelServesText([user]);
      link.title = `Open ${user.path}`;
      link.addEventListener('click', event => {
        event.preventDefault();
        this._actions.openDocument(user.path);
      });
      line.append(...(i ? [', ', link] : [link]));
    });
  }

  private _model: SessionsModel;
  private _actions: SandboxPanel.IActions;
  private _newButton: ToolbarButton;
  private _newTooltip = NEW_TOOLTIP;
  private _status: HTMLElement;
  private _statusText: HTMLElement;
  private _notice: HTMLElement;
  private _error: HTMLElement;
  private _list: HTMLElement;
  private _empty: HTMLElement;
  private _items = new Map<string, HTMLElement>();
  private _timer = 0;
  private _portsBusy = new Set<string>();
  private _portsFetched = new Map<string, number>();
  private _portsUnsupported = new Set<string>();
}

const NEW_TOOLTIP = 'Create a sandbox session';
const EXTEND_TOOLTIP = `Reap this session ${EXTEND_SECONDS / 60} minutes later`;
const EXTEND_BY_TOOLTIP = 'Reap this session later by a duration you type (30m, 1h30m, 2h)';
const PAUSE_TOOLTIP = 'Freeze every process of this session where it is (its time still runs)';
const RESUME_TOOLTIP = 'Let this paused session run on from where it was';
const EGRESS_TOOLTIP = 'See and change the host names this session may reach (its egress policy)';
const FORK_TOOLTIP = "Start a new session from this one's state now (the two then run on apart)";
const TRANSCRIPT_TOOLTIP =
  "Save this session's commands and their output (as this server kept them, scrubbed) as a notebook, and open it";

function timeLeftText(session: ISessionInfo, state: IPanelState): string {
  const left = secondsLeft(session, state.fetchedAt, Date.now());
  return left > 0 ? `reaped in ${formatDuration(left)}` : 'reaping…';
}

/** running, paused, or reaping (its time is up): the row's dot. */
export function rowPhase(session: ISessionInfo, state: IPanelState): 'running' | 'paused' | 'reaping' {
  if (secondsLeft(session, state.fetchedAt, Date.now()) <= 0) {
    return 'reaping';
  }
  return session.paused ? 'paused' : 'running';
}

/** The row's right side: `local · 14m 05s`, `docker · paused · 2h 10m`. */
export function rowMetaText(session: ISessionInfo, state: IPanelState): string {
  const left = secondsLeft(session, state.fetchedAt, Date.now());
  return [session.kind, ...(session.paused ? ['paused'] : []), left > 0 ? formatDuration(left) : 'reaping'].join(' · ');
}

/** A small icon button of a row (its words in the tooltip and for screen readers). */
function iconButton(icon: LabIcon, title: string, className: string, onClick: () => void): HTMLButtonElement {
  const b = document.createElement('button');
  b.className = `jp-TaiSandbox-iconButton ${className}`;
  b.title = title;
  b.setAttribute('aria-label', title);
  b.append(icon.element({ tag: 'span', className: 'jp-TaiSandbox-iconButtonIcon' }));
  b.addEventListener('click', ev => {
    ev.stopPropagation();
    onClick();
  });
  return b;
}
