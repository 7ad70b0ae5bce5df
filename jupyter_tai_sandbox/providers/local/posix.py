"""POSIX process primitives for sandbox-local: group holders, child-exit watching, stops, terminals.

Nothing here knows about sessions or the exec contract; the command classes in
:mod:`.command` and :mod:`.pty` build on these.

Group holders: every command joins a fresh process group led by a small holder
process (``true``, left unreaped: a zombie keeps its pid, and so the group id, out
of reuse). The group keeps its id after the command exits, so a stop never signals
a group id since given to other processes.

Children are reaped on the event loop's thread only (:class:`ChildWatch`), so a
signal sent from that thread to a child not yet reaped can never reach a process
that has since been given the same pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import struct
import sys
import termios
import threading
from collections.abc import Callable, Iterator
from typing import Any


def exit_status(returncode: int) -> int:
    """Python's -N for a signal becomes 128+N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


#: reset by Popen itself (``restore_signals``); Python ignores SIGPIPE in every process of its own
_RESTORED_BY_POPEN = {
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name)
}
_CATCHABLE = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP} - _RESTORED_BY_POPEN)


def inherited_signal_state() -> tuple[list[signal.Signals], set[int]]:
    """The signals this process ignores (that a child would inherit ignored) and the calling thread's
    blocked mask (that a child would inherit blocked)."""
    ignored = [s for s in _CATCHABLE if signal.getsignal(s) == signal.SIG_IGN]
    return ignored, set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


#: what a non-interactive shell (``cmd &``) and nohup leave ignored in what they start in the background
_IGNORED_BY_A_SHELL = frozenset(
    getattr(signal, name) for name in ("SIGINT", "SIGQUIT", "SIGHUP") if hasattr(signal, name)
)


def _dropped(number: int, frame: Any) -> None:
    """Catches a signal this process was started ignoring, and does nothing: the process goes on ignoring it,
    while a child's exec resets it to its default action (exec keeps an ignored signal ignored, not a caught
    one)."""


def spawn_kwargs(pgid: int | None = None) -> dict[str, Any]:
    """Popen arguments for a command: in process group ``pgid`` (0: a new group led by the child;
    None: as Popen's other arguments say), starting with every signal at its default action and
    none blocked, whatever this process inherited.

    A server started in the background of a non-interactive shell (``cmd &``, nohup, many
    process managers) ignores SIGINT and SIGQUIT (nohup: SIGHUP), and exec keeps an ignored signal
    ignored, so ^C and ``interrupt_mode: signal`` would do nothing in its commands. On the main
    thread, those three are then caught and dropped (:func:`_dropped`) instead of ignored, once: the
    server goes on ignoring them, and its commands start with them at their default action through
    Popen's fast path (vfork). Otherwise (another signal ignored, one blocked, another thread) the
    child resets them before it execs: a ``preexec_fn``, which costs a whole fork of the server's
    memory, a few milliseconds per command in a large server.
    """
    ignored, blocked = inherited_signal_state()
    if (
        ignored
        and not blocked
        and set(ignored) <= _IGNORED_BY_A_SHELL
        and threading.current_thread() is threading.main_thread()
    ):
        for number in ignored:
            signal.signal(number, _dropped)
        ignored = []
    kwargs: dict[str, Any] = {}
    if pgid is not None and sys.version_info >= (3, 11):
        kwargs["process_group"] = pgid
    pgid_in_child = pgid if pgid is not None and sys.version_info < (3, 11) else None
    if not ignored and not blocked and pgid_in_child is None:
        return kwargs

    def prepare_child() -> None:
        if pgid_in_child is not None:  # pragma: no cover - 3.10
            os.setpgid(0, pgid_in_child)
        for number in ignored:
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])

    kwargs["preexec_fn"] = prepare_child
    return kwargs


def killpg(pgid: int) -> None:
    """SIGKILL every process in group ``pgid`` (nothing if it is empty or gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


_TRUE = shutil.which("true") or "/bin/true"


def spawn_group_holder() -> int:
    """A holder for a new process group: ``true`` spawned as the group's leader and left unreaped.

    Its zombie keeps the group id reserved (a pid is not given out again before it is
    reaped), so the group keeps its id after the command has exited, at the cost of no
    running process and no pipe. Reaped by :func:`reap_holder`.
    """
    return os.posix_spawn(_TRUE, [_TRUE], {}, setpgroup=0)


def holder_unreaped(pid: int) -> bool:
    """Whether the holder is still ours (running or a zombie): only then is its group id still ours."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def reap_holder(pid: int) -> None:
    """Reap a holder now if it has exited (``true`` exits at once), else once it does."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == 0:
            ChildWatch(pid, lambda _returncode: None)


class ChildWatch:
    """Reaps child ``pid`` once it exits, then calls ``callback(returncode)`` on the running loop.

    ``returncode`` is Python's (``-N`` for signal N), or None when the status could not
    be read (someone else reaped the child). A pidfd watched by the loop where the kernel
    has them (no thread per child, unlike asyncio's default child watcher); otherwise a
    thread waits for the exit *without reaping* and the loop reaps. Either way the reap
    happens on the loop's thread, so :meth:`kill` called there is race-free.
    """

    def __init__(self, pid: int, callback: Callable[[int | None], None]) -> None:
        self.pid = pid
        self.reaped = False
        self._callback = callback
        self._loop = asyncio.get_running_loop()
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            threading.Thread(target=self._wait_in_thread, name=f"tai-sandbox-wait-{pid}", daemon=True).start()
            return
        self._loop.add_reader(self._pidfd, self._reap)

    def _wait_in_thread(self) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
            self._loop.call_soon_threadsafe(self._reap)

    def _reap(self) -> None:
        if self.reaped:
            return
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self.reaped = True
        try:
            _, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: its status is lost
            returncode = None
        else:
            returncode = os.waitstatus_to_exitcode(status) if _ else None
        self._callback(returncode)

    def kill(self) -> None:
        """SIGKILL the child if it is not reaped yet (call on the loop's thread)."""
        if self.reaped:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)  # unreaped, and only this thread reaps: still ours


def set_window(fd: int, rows: int, cols: int) -> None:
    """Set the size of the terminal behind ``fd``."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def processes() -> Iterator[tuple[int, str, int, int, int]]:
    """``(pid, state, ppid, group id, session id)`` of every process visible in /proc."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        yield int(entry), fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])


def group_alive(pgid: int) -> bool:
    """(Blocking: it reads /proc.) Whether a process of group ``pgid`` still lives (a zombie has closed its
    files); True where /proc cannot tell. Call only while the group's holder is unreaped: its id is then
    still the command's."""
    if not os.path.isdir("/proc/self"):
        return True
    return any(group == pgid and _alive(state) for _, state, _, group, _ in processes())


def process_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, session id)`` of ``pid``, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1]), int(fields[3])


def _alive(state: str) -> bool:
    return state not in ("Z", "X")


def kill_verified(pid: int, still_ours: Callable[[int], bool]) -> None:
    """SIGKILL ``pid`` if ``still_ours(pid)`` holds for the process a pidfd pins down.

    The pidfd is opened first and the check made after, so a pid given to another
    process between a /proc scan and the signal is never signalled.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfds: the narrow reuse window stays
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if still_ours(pid):
                os.kill(pid, signal.SIGKILL)
        return
    try:
        if still_ours(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)


def kill_session_but_leader(leader: int, rounds: int = 50) -> None:
    """SIGKILL every live process of session ``leader`` and every child of the leader, not the leader.

    The leader's children are stopped even if they left its session (a command that
    called setsid); what *they* started and moved out of the session is left alone.
    Call only while ``leader`` is an unreaped child of ours, so its pid (and so the
    session id) is still its own. Rescans until a round finds no new process, since
    a member may fork while the first round runs (a killed process cannot fork).
    """

    def ours(pid: int) -> bool:
        stat = process_stat(pid)
        return stat is not None and _alive(stat[0]) and leader in (stat[1], stat[2])

    killed: set[int] = set()
    for _ in range(rounds):
        targets = [
            pid
            for pid, state, ppid, _, sid in processes()
            if pid != leader and pid not in killed and _alive(state) and leader in (ppid, sid)
        ]
        if not targets:
            return
        for pid in targets:
            kill_verified(pid, ours)
            killed.add(pid)


#: the environment variable every local command carries: its session's id
SESSION_MARKER = "TAI_SANDBOX_SESSION"


def kill_marked(session_id: str) -> list[int]:
    """SIGKILL every process whose environment names ``session_id`` (what a dead server's commands left).

    Blocking (it reads /proc); returns the pids signalled.
    """
    marker = f"{SESSION_MARKER}={session_id}".encode()
    killed = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as environ:
                if marker not in environ.read().split(b"\0"):
                    continue
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return killed


def process_identity(pid: int) -> str | None:
    """``<boot id>/<pid>/<start time>``: names one process across pid reuse; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            start = f.read().rsplit(b")", 1)[1].split()[19].decode()
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except (OSError, IndexError):
        return None
    return f"{boot}/{pid}/{start}"
