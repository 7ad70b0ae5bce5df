"""Who a provider's work is for, and each principal's share of a provider's worker threads.

The session chokepoint (:class:`~jupyter_tai_sandbox.sessions.SessionRegistry`)
knows the caller of every door; it records the principal with :func:`act_for`
in the request's context (a :class:`contextvars.ContextVar`, so it follows the
request into the tasks it starts and nowhere else). A provider's worker pool
takes its threads through :class:`FairShare`, which lets one principal hold at
most ``per_principal`` of them at once: a user who floods waits for their own
threads, and everyone else's calls still find free ones. Work done for nobody
in particular (the reaper, the warm pool, shutdown) is not capped.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

from .contract import SandboxQuotaError

#: the principal the current request acts for (None: the server's own work)
acting_for: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tai_sandbox_acting_for", default=None
)


def act_for(principal: str | None) -> None:
    """Record that the rest of the current request (and the tasks it starts) acts for ``principal``."""
    acting_for.set(principal)


class FairShare:
    """Per-principal caps on slots of one pool (0: no cap). Loop-bound: use it from one event loop."""

    def __init__(self, per_principal: int, *, setting: str) -> None:
        self.per_principal = per_principal
        #: the setting that sizes the share, named in the refusal
        self.setting = setting
        self._held: dict[str, int] = {}
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}

    def held(self, principal: str) -> int:
        """Slots ``principal`` holds now."""
        return self._held.get(principal, 0)

    async def take(self, within: float) -> Callable[[], None]:
        """A slot for the current principal, waited for at most ``within`` seconds; returns its release.

        SandboxQuotaError (429) when the principal's own slots stay busy that long.
        """
        principal = acting_for.get()
        if principal is None or self.per_principal <= 0:
            return _nothing
        if self._held.get(principal, 0) >= self.per_principal:
            waiter = asyncio.get_running_loop().create_future()
            queue = self._waiting.setdefault(principal, [])
            queue.append(waiter)
            try:
                await asyncio.wait_for(waiter, within)
            except BaseException as e:
                if waiter.done() and not waiter.cancelled():
                    self._release(principal)  # a slot handed over just as this gave up: pass it on
                if isinstance(e, asyncio.TimeoutError):
                    raise SandboxQuotaError(
                        f"{principal!r} already has {self.per_principal} calls to the sandbox engine in "
                        f"flight, the most one user may hold at once ({self.setting}), and none ended within "
                        f"{within:g} s: send fewer requests at once"
                    ) from None
                raise
            finally:
                if waiter in queue:
                    queue.remove(waiter)
                if not queue and self._waiting.get(principal) is queue:
                    del self._waiting[principal]
            # the slot _release handed over is counted as this caller's already
        else:
            self._held[principal] = self._held.get(principal, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._release(principal)

        return release

    def _release(self, principal: str) -> None:
        for waiter in self._waiting.get(principal, []):
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the first waiter, still counted
                return
        count = self._held.get(principal, 0) - 1
        if count > 0:
            self._held[principal] = count
        else:
            self._held.pop(principal, None)


def _nothing() -> None:
    pass


__all__ = ["FairShare", "act_for", "acting_for"]
