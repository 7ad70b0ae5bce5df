"""Faults the conformance tests plant in a real provider."""

from jupyter_tai_sandbox.contract import NETWORK_ORDER, Sandbox, SessionLimits


def accept_everything(sandbox: Sandbox) -> Sandbox:
    """``sandbox`` claiming limits it does not have (vm isolation, every network, cpu/memory caps), so it
    accepts specs it cannot honour; the suite must catch it."""
    claims = SessionLimits(
        kind=sandbox.kind,
        settings=type(sandbox).__name__,
        max_isolation="vm",
        networks=frozenset(NETWORK_ORDER),
        supports_limits=True,
    )
    sandbox.session_limits = lambda: claims  # type: ignore[method-assign]  # the planted fault
    return sandbox
