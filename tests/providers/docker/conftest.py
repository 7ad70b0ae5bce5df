"""The docker provider's tests' fixtures: ``client``, a client of the live engine for one module, and
``nothing_left`` (a module's ``pytest.mark.usefixtures("nothing_left")``: after its last test nothing it made
is left on the engine). The one provider factory (``provider(**traits)``), ``spec(**changes)`` and the rest
they call from inside their coroutines are plain functions in tests/support/docker.py; ``run`` is
tests/support/aio.py's."""

from tests.support.docker import client, nothing_left

__all__ = ["client", "nothing_left"]
