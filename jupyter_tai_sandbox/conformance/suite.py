"""The suite assembled: :class:`ConformanceSuite` from its check mixins, in one place.

A run takes the checks in :data:`CHECK_MIXINS` order -- the bases of
:class:`ConformanceSuite`, in the order they are listed -- and, within a mixin,
in the order its ``check_`` methods are defined (:func:`~.runner.check_names`).
A new check goes into the mixin of its theme; a new mixin goes into the bases
below, where its checks should run.
"""

from __future__ import annotations

from .base import SuiteBase
from .deadlines import DeadlineChecks, StopChecks
from .execution import ExecChecks
from .held import HeldCommandChecks
from .scale import ScaleChecks
from .sessions import LifecycleChecks, WorkspaceChecks
from .snapshots import SnapshotChecks
from .terminals import PtyChecks


class ConformanceSuite(
    LifecycleChecks,
    ExecChecks,
    DeadlineChecks,
    WorkspaceChecks,
    PtyChecks,
    StopChecks,
    ScaleChecks,
    HeldCommandChecks,
    SnapshotChecks,
):
    """The checks, run one after another; each failure is recorded, not raised."""


#: The check mixins in the order a run takes their checks: the bases of ConformanceSuite, as listed.
CHECK_MIXINS: tuple[type[SuiteBase], ...] = ConformanceSuite.__bases__
