"""The docker provider (``docker``): a container per session on a Docker engine."""

from . import sandbox as _sandbox
from .sandbox import *  # noqa: F403 - what the module's __all__ names

__all__ = _sandbox.__all__
