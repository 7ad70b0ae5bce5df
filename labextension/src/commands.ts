/**
 * The panel's commands: their ids, labels and registration. Each plugin registers the commands
 * it answers with the functions that carry them out.
 */
import { ICommandPalette } from '@jupyterlab/apputils';
import { CommandRegistry } from '@lumino/commands';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { sandboxIcon } from './icon';
import { ISandboxSessions } from './tokens';

export namespace CommandIDs {
  export const newSession = 'tai-sandbox:new-session';
  export const openTerminal = 'tai-sandbox:open-terminal';
  export const restoreTerminal = 'tai-sandbox:restore-terminal';
  export const browseDrive = 'tai-sandbox:browse-drive';
  export const openFiles = 'tai-sandbox:open-files';
  export const destroy = 'tai-sandbox:destroy';
  export const extendTtl = 'tai-sandbox:extend-ttl';
  export const extendTtlBy = 'tai-sandbox:extend-ttl-by';
  export const pause = 'tai-sandbox:pause';
  export const resume = 'tai-sandbox:resume';
  export const fork = 'tai-sandbox:fork';
  export const egressPolicy = 'tai-sandbox:egress-policy';
  export const saveTranscript = 'tai-sandbox:save-transcript';
  export const showPanel = 'tai-sandbox:show-panel';
}

/** The palette's category for the panel's commands. */
export const PALETTE_CATEGORY = 'Sandbox';

function addToPalette(palette: ICommandPalette | null, commands: string[]): void {
  for (const command of commands) {
    palette?.addItem({ command, category: PALETTE_CATEGORY });
  }
}

/**
 * A command on one session: `args.id`, or the one the user picks (`verb` names the action in
 * the picker); `none` is what it returns when there is no session to act on.
 */
export function addOnSessionCommand<T>(
  commands: CommandRegistry,
  sessions: ISandboxSessions,
  id: string,
  options: {
    label: string;
    caption: string;
    verb: string;
    none: T;
    run(sessionId: string): Promise<T>;
    /** Why the provider cannot do it (its status says so), or null; the command hides while it cannot. */
    unable?: () => string | null;
  }
): void {
  const unable = options.unable ?? (() => null);
  commands.addCommand(id, {
    label: options.label,
    caption: options.caption,
    isEnabled: () => !unable(),
    isVisible: () => !unable(),
    execute: async args => {
      const why = unable();
      if (why) {
        sessions.notifyError(`Cannot ${options.verb}: ${why}`);
        return options.none;
      }
      const sessionId = await sessions.pickSession(args, options.verb);
      return sessionId ? options.run(sessionId) : options.none;
    }
  });
}

/**
 * Why the provider cannot pause or fork (GET status says `pausable` / `forkable` false), or
 * null when it can or the status is not known yet (the server then answers for itself).
 */
export function providerUnable(
  sessions: Pick<ISandboxSessions, 'model'>,
  flag: 'pausable' | 'forkable',
  verb: string
): string | null {
  const status = sessions.model.state.status;
  if (!status || status.kind === 'off' || status[flag] !== false) {
    return null;
  }
  return `the ${status.kind} provider cannot ${verb} sessions (GET /api/sandbox/status: ${flag} false).`;
}

/** New, Destroy, Extend, Pause, Resume and Fork: the session actions of the sessions plugin. */
export function addSessionCommands(
  commands: CommandRegistry,
  sessions: ISandboxSessions,
  palette: ICommandPalette | null
): void {
  commands.addCommand(CommandIDs.newSession, {
    label: 'New Sandbox Session…',
    caption: 'Create a sandbox session',
    icon: sandboxIcon,
    execute: () => sessions.newSession()
  });
  addOnSessionCommand(commands, sessions, CommandIDs.destroy, {
    label: 'Destroy Sandbox Session…',
    caption: 'Destroy a sandbox session',
    verb: 'destroy',
    none: false,
    run: id => sessions.destroy(id)
  });
  addOnSessionCommand(commands, sessions, CommandIDs.extendTtl, {
    label: 'Extend Sandbox Session by 30 Minutes',
    caption: "Reap a sandbox session 30 minutes later (within the operator's maximum)",
    verb: 'extend',
    none: false,
    run: id => sessions.extendTtl(id)
  });
  addOnSessionCommand(commands, sessions, CommandIDs.extendTtlBy, {
    label: 'Extend Sandbox Session By…',
    caption: "Reap a sandbox session later by a duration you type (30m, 1h30m; within the operator's maximum)",
    verb: 'extend',
    none: false,
    run: id => sessions.extendTtlBy(id)
  });
  addOnSessionCommand(commands, sessions, CommandIDs.pause, {
    label: 'Pause Sandbox Session',
    caption: 'Freeze every process of a sandbox session where it is (its time still runs)',
    verb: 'pause',
    none: false,
    run: id => sessions.setPaused(id, true),
    unable: () => providerUnable(sessions, 'pausable', 'pause')
  });
  addOnSessionCommand(commands, sessions, CommandIDs.resume, {
    label: 'Resume Sandbox Session',
    caption: 'Let a paused sandbox session run on from where it was',
    verb: 'resume',
    none: false,
    run: id => sessions.setPaused(id, false),
    unable: () => providerUnable(sessions, 'pausable', 'pause')
  });
  addOnSessionCommand(commands, sessions, CommandIDs.fork, {
    label: 'Fork Sandbox Session',
    caption: "Start a new sandbox session from a session's state now",
    verb: 'fork',
    none: null,
    run: id => sessions.fork(id),
    unable: () => providerUnable(sessions, 'forkable', 'fork')
  });
  addToPalette(palette, [
    CommandIDs.newSession,
    CommandIDs.destroy,
    CommandIDs.extendTtl,
    CommandIDs.extendTtlBy,
    CommandIDs.pause,
    CommandIDs.resume,
    CommandIDs.fork
  ]);
}

/** Show the Sandbox panel; with `id`, also scroll to that session and mark it. */
export function addPanelCommands(
  commands: CommandRegistry,
  show: (sessionId: string | null) => void,
  palette: ICommandPalette | null
): void {
  commands.addCommand(CommandIDs.showPanel, {
    label: 'Show Sandbox Sessions',
    execute: args => show(stringArg(args, 'id'))
  });
  addToPalette(palette, [CommandIDs.showPanel]);
}

/** Open a terminal tab into a session, and reattach a restored one. */
export function addTerminalCommands(
  commands: CommandRegistry,
  sessions: ISandboxSessions,
  actions: {
    open(id: string): Promise<unknown>;
    restore(sessionId: string, execId: string): unknown;
  },
  palette: ICommandPalette | null
): void {
  addOnSessionCommand<unknown>(commands, sessions, CommandIDs.openTerminal, {
    label: 'Open Sandbox Terminal',
    caption: 'Open a terminal in a sandbox session',
    verb: 'open a terminal in',
    none: null,
    run: id => actions.open(id)
  });
  commands.addCommand(CommandIDs.restoreTerminal, {
    label: 'Reattach a Sandbox Terminal',
    execute: args => {
      const sessionId = stringArg(args, 'sessionId');
      const execId = stringArg(args, 'execId');
      return sessionId && execId ? actions.restore(sessionId, execId) : null;
    }
  });
  addToPalette(palette, [CommandIDs.openTerminal]);
}

/** Browse a session's workspace in a tab of its own. */
export function addFilesCommands(
  commands: CommandRegistry,
  sessions: ISandboxSessions,
  open: (id: string) => Promise<unknown>,
  palette: ICommandPalette | null
): void {
  addOnSessionCommand<unknown>(commands, sessions, CommandIDs.openFiles, {
    label: 'Browse Sandbox Files',
    caption: "Browse a sandbox session's workspace",
    verb: 'browse',
    none: null,
    run: id => open(id)
  });
  addToPalette(palette, [CommandIDs.openFiles]);
}

/** Show the Sandbox drive's browser, in a session's folder with `id`. */
export function addDriveCommands(
  commands: CommandRegistry,
  browse: ((sessionId: string) => Promise<void>) | null,
  palette: ICommandPalette | null
): void {
  commands.addCommand(CommandIDs.browseDrive, {
    label: 'Show Sandbox Files',
    caption: "Show the Sandbox drive (a session's workspace) in the file browser",
    isEnabled: () => !!browse,
    execute: async args => {
      if (browse) {
        await browse(stringArg(args, 'id') ?? '');
      }
    }
  });
  addToPalette(palette, [CommandIDs.browseDrive]);
}

/** A non-empty string argument of a command, or null. */
export function stringArg(args: ReadonlyPartialJSONObject | undefined, key: string): string | null {
  const value = args?.[key];
  return typeof value === 'string' && value ? value : null;
}
