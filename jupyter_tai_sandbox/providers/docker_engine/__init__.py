"""The Docker Engine API adapter, used by the docker, swarm and vm providers: every call this package
makes to a Docker engine (:class:`DockerEngine`), and the labels, prefixes and paths its things carry
(``names``)."""

from . import engine as _engine
from .engine import *  # noqa: F403 - what the module's __all__ names

__all__ = _engine.__all__
