/**
 * jupyter-tai-sandbox: the JupyterLab panel of the sandbox server extension, as plugins that
 * share the sessions (ISandboxSessions) and the terminal tabs (ISandboxTerminalTracker).
 */
import { JupyterFrontEndPlugin } from '@jupyterlab/application';

import { drivePlugin } from './plugins/drive';
import { filesPlugin } from './plugins/files';
import { panelPlugin } from './plugins/panel';
import { runningPlugin } from './plugins/running';
import { sessionsPlugin } from './plugins/sessions';
import { terminalsPlugin } from './plugins/terminals';

export { CommandIDs } from './commands';
export { ISandboxSessions, ISandboxTerminalTracker } from './tokens';

const plugins: JupyterFrontEndPlugin<unknown>[] = [
  sessionsPlugin,
  panelPlugin,
  terminalsPlugin,
  filesPlugin,
  drivePlugin,
  runningPlugin
];

export default plugins;
