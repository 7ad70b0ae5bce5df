"""The suite's ground: its constants, the expectation helpers and :class:`SuiteBase`.

:class:`SuiteBase` holds what every check leans on -- the constructor, the helpers
(``t``, ``spec``, ``session``, ``sh``, ``read_pid``, ``is_running``, ``expect_stopped``,
``kill_pid``, ``timed``) and the running of checks (``run_check``, ``run``, ``cleanup``).
The checks themselves live in mixins of their own theme; :mod:`.suite` assembles them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable
from typing import Any

from ..contract import (
    NETWORK_ORDER,
    ExecHandle,
    ExitItem,
    OutputChunk,
    Sandbox,
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
    SessionSpec,
)

KILLED = 137
INTERRUPTED = 130  # 128 + SIGINT

#: The payload sizes a certifying run uses; smaller ones are a weakened run.
FULL_STRENGTH = {"big_stdin_bytes": 16 << 20, "big_output_bytes": 4 << 20}
#: The most a certifying run may stretch the suite's deadlines and waits (a loaded CI machine).
MAX_CERTIFYING_TIMEOUT_SCALE = 2.0
#: How an entry of a run that certifies nothing starts.
NOT_A_CERTIFICATION = "not a certification"
#: the longest the suite's closing destroy of one session may take (at most a check's limit): a provider whose
#: destroy waits on a command it cannot stop is reported, not waited for
CLEANUP_DESTROY_SECONDS = 30.0


class CheckFailed(Exception):
    """One expectation of a check did not hold."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


async def expect_raises(error: type[BaseException], action: Awaitable[Any], what: str) -> BaseException:
    try:
        result = await action
    except error as e:
        return e
    except Exception as e:
        raise CheckFailed(f"{what}: expected {error.__name__}, got {type(e).__name__}: {e}") from None
    raise CheckFailed(f"{what}: expected {error.__name__}, got a result {_short(result)}")


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


async def drain(handle: ExecHandle) -> tuple[bytes, bytes, list[Any]]:
    """Read a handle's output to its end: (stdout, stderr, items)."""
    items: list[Any] = []
    out, err = bytearray(), bytearray()
    async for item in handle.output:
        items.append(item)
        if isinstance(item, OutputChunk):
            (out if item.stream == "stdout" else err).extend(item.data)
    return bytes(out), bytes(err), items


def exit_items(items: list[Any]) -> list[ExitItem]:
    return [i for i in items if isinstance(i, ExitItem)]


def expect_one_exit(items: list[Any], code: int | None, what: str) -> None:
    exits = exit_items(items)
    expect(len(exits) == 1, f"{what}: expected exactly one exit item, got {len(exits)}")
    expect(items[-1] is exits[0], f"{what}: the exit item is not the last item")
    if code is not None:
        expect(exits[0].exit_code == code, f"{what}: expected exit status {code}, got {exits[0].exit_code}")


class SuiteBase:
    """The checks, run one after another; each failure is recorded, not raised.

    The ground of :class:`~jupyter_tai_sandbox.conformance.ConformanceSuite`: its
    constructor, the helpers the checks share, and the running of checks by name.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        image: str | None = None,
        timeout_scale: float = 1.0,
        big_stdin_bytes: int = FULL_STRENGTH["big_stdin_bytes"],
        big_output_bytes: int = FULL_STRENGTH["big_output_bytes"],
        check_timeout: float = 120.0,
    ) -> None:
        self.sandbox = sandbox
        self.image = image
        self.scale = timeout_scale
        self.big_stdin_bytes = big_stdin_bytes
        self.big_output_bytes = big_output_bytes
        self.check_timeout = check_timeout
        self.tag = secrets.token_hex(4)
        self.created: list[SandboxSession] = []
        self.failures: list[str] = []

    # -------------------------------------------------------------- helpers

    def t(self, seconds: float) -> float:
        return seconds * self.scale

    def spec(self, **changes: Any) -> SessionSpec:
        """A spec of this run; on a provider without the default network (egress), the most open one it has."""
        changes.setdefault("consumer", f"conformance-{self.tag}")
        if "network" not in changes and SessionSpec.network not in self.sandbox.networks:
            changes["network"] = max(self.sandbox.networks, key=NETWORK_ORDER.index)
        return SessionSpec(image=self.image, **changes)

    async def session(self, **changes: Any) -> SandboxSession:
        session = await self.sandbox.create(self.spec(**changes))
        self.created.append(session)
        return session

    async def sh(self, session: SandboxSession, script: str, *args: str, timeout: float = 30.0) -> bytes:
        result = await session.exec(["sh", "-c", script, "sh", *args], timeout_seconds=self.t(timeout))
        expect(
            result.exit_code == 0, f"helper command {script!r} exited {result.exit_code}: {result.stderr!r}"
        )
        return result.stdout

    async def read_pid(self, session: SandboxSession, path: str, timeout: float = 5.0) -> str:
        deadline = time.monotonic() + self.t(timeout)
        while time.monotonic() < deadline:
            try:
                pid = (await session.get_file(path)).decode().strip()
            except SandboxNotFoundError:
                pid = ""
            if pid.isdigit():
                return pid
            await asyncio.sleep(0.05)
        raise CheckFailed(f"the command never wrote its pid to {path}")

    async def is_running(self, session: SandboxSession, pid: str) -> bool:
        """Whether ``pid`` is a live process (a zombie counts as stopped)."""
        stat = await self.sh(session, 'cat "/proc/$1/stat" 2>/dev/null || true', pid)
        if not stat.strip():
            return False
        state = stat.rsplit(b")", 1)[-1].split()[0]
        return state not in (b"Z", b"X")

    async def expect_stopped(self, session: SandboxSession, pid: str, what: str) -> None:
        deadline = time.monotonic() + self.t(3)
        while await self.is_running(session, pid):
            if time.monotonic() > deadline:
                raise CheckFailed(f"{what}: process {pid} is still running")
            await asyncio.sleep(0.1)

    async def kill_pid(self, session: SandboxSession, pid: str) -> None:
        await session.exec(["kill", "-9", pid], timeout_seconds=self.t(10))

    async def timed(self, action: Awaitable[Any]) -> tuple[Any, float]:
        start = time.monotonic()
        result = await action
        return result, time.monotonic() - start

    # ------------------------------------------------------------------ run

    async def run_check(self, name: str) -> str | None:
        """Run one check by name; return its failure, or None when it passed."""
        check = getattr(self, f"check_{name}")
        limit = self.check_timeout * self.scale
        try:
            await asyncio.wait_for(check(), timeout=limit)
        except CheckFailed as e:
            return f"{name}: {e}"
        except TimeoutError:
            return f"{name}: did not finish within {limit:g}s"
        except Exception as e:
            return f"{name}: raised {type(e).__name__}: {e}"
        return None

    async def run(self, names: list[str]) -> list[str]:
        """Run the named checks in order; return their failures (no verdict on certification)."""
        try:
            for name in names:
                failure = await self.run_check(name)
                if failure is not None:
                    self.failures.append(failure)
        finally:
            await self.cleanup()
        left = [i.id for i in await self.sandbox.list() if self.tag in i.consumer]
        if left:
            self.failures.append(f"cleanup: sessions the suite destroyed are still listed: {left}")
        return self.failures

    async def cleanup(self) -> None:
        limit = min(self.check_timeout, CLEANUP_DESTROY_SECONDS) * self.scale
        for session in self.created:
            try:
                await asyncio.wait_for(session.destroy(remove_workspace=True), limit)
            except TimeoutError:
                self.failures.append(f"cleanup: destroying session {session.id} took longer than {limit:g}s")
            except SandboxError:
                pass
        self.created.clear()
