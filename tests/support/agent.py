"""Helpers the agent tests import (their fixtures are in tests/agent/conftest.py)."""

from __future__ import annotations

import asyncio


def run(coro, timeout: float = 120):
    """Run a coroutine on a fresh loop, bounded (the suite brings no pytest-asyncio)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
