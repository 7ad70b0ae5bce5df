/** The New session dialog body: a form whose value is an ISessionForm. */
import { Dialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { IStatus } from './api';
import { DURATION_HINT } from './duration';
import { isolationWarning, limitHints } from './model';
import { ISessionForm } from './spec';

type Field = HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement;

export class NewSessionBody extends Widget implements Dialog.IBodyWidget<ISessionForm> {
  constructor(initial: ISessionForm, status: IStatus | null) {
    super();
    this.addClass('jp-TaiSandbox-newSession');
    const networks = status?.networks?.length ? status.networks : ['egress', 'internal', 'none'];
    const limits = status?.supports_limits !== false;
    const hints = limitHints(status);
    const warning = isolationWarning(status);
    if (warning) {
      const note = document.createElement('p');
      note.className = 'jp-TaiSandbox-formWarning';
      note.textContent = `${warning} The ${status?.kind ?? ''} provider runs a session's commands as the server's own user, in a folder of this machine.`;
      this.node.appendChild(note);
    }

    this._image = this._input('image', 'Image', initial.image, 'provider default');
    this._durability = this._select('durability', 'Durability', initial.durability, [
      'ephemeral',
      'persistent'
    ]);
    this._workspaceKey = this._input(
      'workspaceKey',
      'Workspace key',
      initial.workspaceKey,
      'needed for persistent'
    );
    this._network = this._select(
      'network',
      'Network',
      networks.includes(initial.network) ? initial.network : networks[0],
      networks
    );
    this._ttl = this._input('ttlSeconds', 'TTL', initial.ttlSeconds, '1h', `how long the session lives: ${DURATION_HINT}`);
    this._cpu = this._input('cpu', 'CPUs', initial.cpu, hints.cpu.placeholder, hints.cpu.hint);
    this._memory = this._input(
      'memoryMb',
      'Memory (MB)',
      initial.memoryMb,
      hints.memory.placeholder,
      hints.memory.hint
    );
    if (!limits) {
      this._cpu.disabled = true;
      this._memory.disabled = true;
    }
    if (status?.egress_policy) {
      // an allow-list only where the provider enforces one (an egress gateway), on network egress
      this._egressAllow = document.createElement('textarea');
      this._egressAllow.rows = 3;
      this._egressAllow.spellcheck = false;
      this._egressAllow.value = initial.egressAllow ?? '';
      this._egressAllow.placeholder = 'any host';
      this._row('egressAllow', 'Allowed hosts', this._egressAllow, EGRESS_ALLOW_HINT);
      const row = this._egressAllow.closest('label') as HTMLElement;
      const sync = () => {
        row.hidden = this._network.value !== 'egress';
      };
      this._network.addEventListener('change', sync);
      sync();
    }
  }

  getValue(): ISessionForm {
    return {
      image: this._image.value,
      durability: this._durability.value as ISessionForm['durability'],
      workspaceKey: this._workspaceKey.value,
      network: this._network.value as ISessionForm['network'],
      ttlSeconds: this._ttl.value,
      cpu: this._cpu.value,
      memoryMb: this._memory.value,
      egressAllow: this._egressAllow && this._network.value === 'egress' ? this._egressAllow.value : ''
    };
  }

  private _row(name: string, label: string, field: Field, hint?: string): void {
    const row = document.createElement('label');
    row.className = 'jp-TaiSandbox-formRow';
    const text = document.createElement('span');
    text.textContent = label;
    field.name = name;
    field.classList.add('jp-mod-styled');
    row.append(text, field);
    if (hint) {
      const small = document.createElement('span');
      small.className = 'jp-TaiSandbox-formHint';
      small.dataset.field = name;
      small.textContent = hint;
      field.title = hint;
      row.append(small);
    }
    this.node.appendChild(row);
  }

  private _input(
    name: string,
    label: string,
    value: string,
    placeholder: string,
    hint?: string
  ): HTMLInputElement {
    const input = document.createElement('input');
    input.type = 'text';
    input.value = value;
    input.placeholder = placeholder;
    this._row(name, label, input, hint);
    return input;
  }

  private _select(name: string, label: string, value: string, options: string[]): HTMLSelectElement {
    const select = document.createElement('select');
    for (const option of options) {
      const o = document.createElement('option');
      o.value = o.textContent = option;
      select.appendChild(o);
    }
    select.value = value;
    this._row(name, label, select);
    return select;
  }

  private _image: HTMLInputElement;
  private _durability: HTMLSelectElement;
  private _workspaceKey: HTMLInputElement;
  private _network: HTMLSelectElement;
  private _ttl: HTMLInputElement;
  private _cpu: HTMLInputElement;
  private _memory: HTMLInputElement;
  private _egressAllow: HTMLTextAreaElement | null = null;
}

const EGRESS_ALLOW_HINT =
  "empty: any host, no policy; else one a line (example.com, *.example.com, NAME:PORT), within the operator's rule: only those, through an egress gateway";
