"""The conformance suite: what certifies a provider.

``await run_sandbox_conformance(provider)`` runs every check against a live
provider at full strength and returns a list of failures, each naming the
check and what was seen; an empty list certifies the provider. A run that is
not a certification -- a subset of the checks (``only``), smaller payloads or a
stretched ``timeout_scale`` -- never returns a bare ``[]``: its list ends with
an entry starting ``"not a certification: "``. An unknown check name raises
ValueError. Every session the suite creates is destroyed before it returns
(persistent test workspaces included).

The same checks have a pytest face for provider authors,
:class:`jupyter_tai_sandbox.testing.SandboxConformance`, where each check is its
own test. The checks use only the commands the session image contract names,
plus ``head``, ``printf``, ``stty`` and ``ln`` (checks needing ``ln`` are
skipped when it is missing).
"""

from .base import (
    FULL_STRENGTH,
    INTERRUPTED,
    KILLED,
    MAX_CERTIFYING_TIMEOUT_SCALE,
    NOT_A_CERTIFICATION,
    CheckFailed,
    SuiteBase,
    drain,
    exit_items,
    expect,
    expect_one_exit,
    expect_raises,
)
from .runner import (
    check_doc,
    check_names,
    main,
    run_checks,
    run_sandbox_conformance,
    selected_checks,
    weakenings,
)
from .suite import CHECK_MIXINS, ConformanceSuite

__all__ = [
    "CHECK_MIXINS",
    "FULL_STRENGTH",
    "INTERRUPTED",
    "KILLED",
    "MAX_CERTIFYING_TIMEOUT_SCALE",
    "NOT_A_CERTIFICATION",
    "CheckFailed",
    "ConformanceSuite",
    "SuiteBase",
    "check_doc",
    "check_names",
    "drain",
    "exit_items",
    "expect",
    "expect_one_exit",
    "expect_raises",
    "main",
    "run_checks",
    "run_sandbox_conformance",
    "selected_checks",
    "weakenings",
]
