"""The vm provider's tests' fixture: ``client``, a client of the live Docker engine for one module (the seats
and owner bridges are the engine's; tests/support/docker.py)."""

from tests.support.docker import client

__all__ = ["client"]
