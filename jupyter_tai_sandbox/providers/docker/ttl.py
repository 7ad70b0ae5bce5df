"""A docker session's moved end: TTL records on the engine.

Container labels cannot change, so a session's new end (``set_expiry``) is a
small record: an empty volume ``tai-ttl-<session id>-<stamp>`` labelled
``jupyter-tai-sandbox.ttl`` (the session id) and ``.expires``. The newest record
of a session wins; a change makes its record before removing the older ones, so
a reader never finds none. get(), list() and reap() read the records in the same
round of engine calls they already make (one volume listing), so any provider of
the deployment, a restarted server included, honours them. Records go with
their session; a reap removes those whose session is gone.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ...contract import SandboxNotFoundError
from ..docker_engine import DockerEngine, EngineRefusedError
from ..docker_engine.names import LABEL_EXPIRES, LABEL_TTL, TTL_PREFIX

#: a TTL record whose session is not found is removed by a reap once it is this old
STRAY_TTL_GRACE_SECONDS = 60.0


class _Timed(Protocol):
    @property
    def id(self) -> str: ...

    expires_at: float


def expiries(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Session id -> the end its newest TTL record gives."""
    newest: dict[str, tuple[str, float]] = {}
    for volume in records:
        labels = volume.get("Labels") or {}
        name, session_id = str(volume.get("Name", "")), labels.get(LABEL_TTL)
        try:
            expires = float(labels[LABEL_EXPIRES])
        except (KeyError, ValueError):
            continue
        if session_id and name > newest.get(session_id, ("", 0.0))[0]:
            newest[session_id] = (name, expires)
    return {session_id: expires for session_id, (_, expires) in newest.items()}


T = TypeVar("T", bound=_Timed)


def retimed(session: T, ends: Mapping[str, float]) -> T:
    """The session with the end its newest TTL record gives (the labels' otherwise)."""
    session.expires_at = ends.get(session.id, session.expires_at)
    return session


class TtlRecords:
    """The TTL records of one provider's sessions on its engine."""

    def __init__(self, engine: DockerEngine, labels: Mapping[str, str]) -> None:
        self._engine = engine
        self._labels = dict(labels)

    async def of(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The records of one session, or of all."""
        return await self._engine.volumes(f"{LABEL_TTL}={session_id}" if session_id else LABEL_TTL)

    async def move(self, session_id: str, expires_at: float) -> None:
        """Record a session's new end: a new record first, then the older ones go."""
        name = f"{TTL_PREFIX}{session_id}-{time.time_ns():020d}"
        await self._engine.create_volume(
            name, {**self._labels, LABEL_TTL: session_id, LABEL_EXPIRES: repr(float(expires_at))}
        )
        for volume in await self.of(session_id):
            if volume.get("Name", "") < name:
                with contextlib.suppress(EngineRefusedError):
                    await self._engine.remove_volume(volume["Name"])

    async def drop(self, session_id: str) -> None:
        for volume in await self.of(session_id):
            with contextlib.suppress(EngineRefusedError):
                await self._engine.remove_volume(volume["Name"])

    async def drop_strays(self, records: list[dict[str, Any]], live: set[str], now: float) -> None:
        """Records whose session is gone (its container removed behind our back, or a teardown that failed
        midway); a minute's grace covers a session made after the listing."""
        for volume in records:
            if (volume.get("Labels") or {}).get(LABEL_TTL) in live:
                continue
            stamp = volume.get("Name", "").rsplit("-", 1)[-1]
            if stamp.isdigit() and now - int(stamp) / 1e9 < STRAY_TTL_GRACE_SECONDS:
                continue
            with contextlib.suppress(EngineRefusedError, SandboxNotFoundError):
                await self._engine.remove_volume(volume["Name"])
