/**
 * The user's settings of the panel (schema/plugin.json), read with their defaults.
 */
import { Network } from './api';
import { ISpecDefaults } from './spec';

/**
 * The plugin whose settings schema is schema/plugin.json: the sessions plugin keeps the id the
 * single plugin had, so the settings users saved keep applying.
 */
export const SETTINGS_PLUGIN_ID = 'jupyter-tai-sandbox:plugin';

export interface ISandboxSettings extends ISpecDefaults {
  terminalCommand: string[];
  pollIntervalSeconds: number;
}

export const DEFAULT_SETTINGS: ISandboxSettings = {
  image: '',
  ttlSeconds: 3600,
  network: 'egress',
  terminalCommand: ['sh', '-i'],
  pollIntervalSeconds: 3
};

/** What readSettings needs of ISettingRegistry.ISettings. */
export interface ISettingsSource {
  get(key: string): { composite: unknown };
}

export function readSettings(settings: ISettingsSource): ISandboxSettings {
  const get = <T>(key: string, fallback: T): T => {
    const value = settings.get(key).composite as T | undefined;
    return value === undefined || value === null ? fallback : value;
  };
  const command = get<string[]>('terminalCommand', DEFAULT_SETTINGS.terminalCommand);
  return {
    image: get('defaultImage', DEFAULT_SETTINGS.image),
    ttlSeconds: get('defaultTtlSeconds', DEFAULT_SETTINGS.ttlSeconds),
    network: get<Network>('defaultNetwork', DEFAULT_SETTINGS.network),
    terminalCommand: command.length ? command : DEFAULT_SETTINGS.terminalCommand,
    pollIntervalSeconds: get('pollIntervalSeconds', DEFAULT_SETTINGS.pollIntervalSeconds)
  };
}
