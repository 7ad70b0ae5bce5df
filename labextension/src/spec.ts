/**
 * The New session form: its values (strings, as inputs give them) and their
 * checked conversion into a SessionSpec, with messages that say what to change.
 */
import { Durability, ISessionSpec, Network } from './api';
import { DurationError, parseDuration } from './duration';

export interface ISessionForm {
  image: string;
  durability: Durability;
  workspaceKey: string;
  network: Network;
  /** The TTL as typed: seconds, or a duration with units (`1h30m`). */
  ttlSeconds: string;
  cpu: string;
  memoryMb: string;
  /**
   * With network egress: the host names the session may reach, as typed (one a line; commas and spaces
   * also part them); empty: no egress policy (any host, as before).
   */
  egressAllow?: string;
}

export interface ISpecDefaults {
  image: string;
  ttlSeconds: number;
  network: Network;
}

export const WORKSPACE_KEY = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;

/** The entries of a host list as typed: one a line (commas and spaces also part them), empty ones dropped. */
export function parseEntries(text: string): string[] {
  return text
    .split(/[\s,]+/)
    .map(entry => entry.trim())
    .filter(entry => entry);
}

/** A form problem: the message is shown to the user as is. */
export class SpecFormError extends Error {
  constructor(
    readonly field: keyof ISessionForm,
    message: string
  ) {
    super(message);
    this.name = 'SpecFormError';
  }
}

export function defaultForm(defaults: ISpecDefaults): ISessionForm {
  return {
    image: defaults.image,
    durability: 'ephemeral',
    workspaceKey: '',
    network: defaults.network,
    ttlSeconds: String(defaults.ttlSeconds),
    cpu: '',
    memoryMb: '',
    egressAllow: ''
  };
}

function optionalNumber(
  field: keyof ISessionForm,
  raw: string,
  label: string,
  integer: boolean
): number | null {
  const text = raw.trim();
  if (!text) {
    return null;
  }
  const value = Number(text);
  if (!Number.isFinite(value) || value <= 0 || (integer && !Number.isInteger(value))) {
    throw new SpecFormError(
      field,
      `${label} must be a positive ${integer ? 'whole number' : 'number'} (or empty for no limit), not "${text}".`
    );
  }
  return value;
}

/** The spec to POST, or a SpecFormError naming the field to fix. */
export function buildSpec(form: ISessionForm): ISessionSpec {
  const spec: ISessionSpec = {
    network: form.network,
    durability: form.durability
  };
  const image = form.image.trim();
  spec.image = image || null;

  const key = form.workspaceKey.trim();
  if (key) {
    if (!WORKSPACE_KEY.test(key)) {
      throw new SpecFormError(
        'workspaceKey',
        `Workspace key "${key}" must start with a letter or digit and use only letters, digits, "_", "." and "-" (at most 64).`
      );
    }
    if (form.durability !== 'persistent') {
      throw new SpecFormError(
        'workspaceKey',
        'A workspace key names a persistent workspace: choose durability "persistent", or leave the key empty.'
      );
    }
    spec.workspace_key = key;
  } else if (form.durability === 'persistent') {
    throw new SpecFormError(
      'workspaceKey',
      'A persistent session needs a workspace key: the name under which its workspace is kept.'
    );
  }

  let ttl: number;
  try {
    ttl = parseDuration(form.ttlSeconds, 'TTL');
  } catch (error) {
    if (error instanceof DurationError) {
      throw new SpecFormError('ttlSeconds', error.message);
    }
    throw error;
  }
  spec.ttl_seconds = ttl;

  const cpu = optionalNumber('cpu', form.cpu, 'CPU', false);
  if (cpu !== null) {
    spec.cpu = cpu;
  }
  const memory = optionalNumber('memoryMb', form.memoryMb, 'Memory (MB)', true);
  if (memory !== null) {
    spec.memory_mb = memory;
  }
  const allow = parseEntries(form.egressAllow ?? '');
  if (allow.length) {
    if (form.network !== 'egress') {
      throw new SpecFormError(
        'egressAllow',
        `Allowed hosts need network "egress" (network "${form.network}" reaches no host): choose egress, or empty the list.`
      );
    }
    spec.egress = { allow };
  }
  return spec;
}
