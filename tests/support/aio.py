"""Coroutines in the synchronous tests: the suite brings no pytest-asyncio (pytest-jupyter brings its own loop
for the server tests), so a test runs its coroutine on a fresh loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """``coro``'s result, on a fresh loop; bounded to ``timeout`` seconds when given (else the test's own
    timeout is the only bound)."""
    return asyncio.run(coro if timeout is None else asyncio.wait_for(coro, timeout))
