"""What the providers count for the metrics, without importing them: a few calls that do nothing until a
server turns its metrics on (:func:`install`).

A provider calls these where the event seam cannot see (under the gate): the Docker engine adapter's error
path, an agent connection opened again after its loss, a take from the warm pool. Each call is one global
read when metrics are off, and one counter's increment when they are on.
"""

from __future__ import annotations

from typing import Protocol


class Sink(Protocol):
    def engine_error(self, error: str) -> None: ...

    def agent_reconnect(self) -> None: ...

    def pool_take(self, hit: bool) -> None: ...


_sink: Sink | None = None


def install(sink: Sink | None) -> None:
    """Where the counts go from now on (None: nowhere)."""
    global _sink
    _sink = sink


def engine_error(error: BaseException) -> None:
    """An engine call failed with ``error`` (the contract's error it was translated to)."""
    sink = _sink
    if sink is not None:
        sink.engine_error(type(error).__name__)


def agent_reconnect() -> None:
    """A session agent's connection was opened again after the last one was lost."""
    sink = _sink
    if sink is not None:
        sink.agent_reconnect()


def pool_take(hit: bool) -> None:
    """A create asked the warm pool for a container: ``hit`` when it got one."""
    sink = _sink
    if sink is not None:
        sink.pool_take(hit)
