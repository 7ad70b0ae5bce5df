"""How the suite is scheduled over xdist workers (``python -m pytest -n 4``; pyproject's addopts add
``--dist loadgroup --no-loadscope-reorder``, which do nothing without ``-n``). Only xdist's and pytest's
public API: markers, hooks, ``workeroutput``.

* Work units: each module is one unit (its tests run in order on one worker, so a last "nothing is
  left" test sees the whole module), unless its tests name an ``xdist_group`` (the browser tests
  share one, so one ``jupyter lab`` runs at a time): every other test gets an ``xdist_group`` named for
  its module, and xdist's ``loadgroup`` keeps a group on one worker. Units start slowest first, by their
  ``slow`` marks (the collection is sorted so; ``--no-loadscope-reorder`` keeps that order).
* The serial group: tests marked ``alone`` (CPU floods) or ``disturbs_engine`` (they freeze, kill or
  restart the shared Docker engine) run by themselves, after every other test has finished.
* Without xdist (no ``-n``, or ``-n 0``) they are moved to the end of the run, engine killers last.
* Under xdist every worker deselects them and says which they were; once the workers are done, the
  controller runs them in one more pytest process (``-n 0``) and feeds each of its reports into its own
  hooks, so they print in the same output, count in the same summary and durations table, and a
  failure fails the run's exit status. That process's own output is in tests/artifacts/serial-group.log.

Loaded by tests/conftest.py (``pytest_plugins``).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import ARTIFACTS, REPO
from tests.support.docker import DISTURB
from tests.support.machine_cpu import MachineCpu

#: set in the process that runs the serial group: the fd its reports go to, one JSON line each
REPORTS_FD = "TAI_SANDBOX_SERIAL_REPORTS_FD"
#: the serial group's own part of the run (its deployment scope and run label, see tests/support)
PART = "serial"


def serial_rank(item: pytest.Item) -> int:
    """0: runs with the others; 1: alone; 2: freezes the engine; 3: kills or restarts it (always last)."""
    mark = item.get_closest_marker("disturbs_engine")
    if mark is not None and DISTURB:  # else it skips (tests/conftest.py), wherever it is
        return 3 if "kills" in mark.args else 2
    return 1 if item.get_closest_marker("alone") is not None else 0


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def is_controller(config: pytest.Config) -> bool:
    """The xdist controller (it runs no test itself)."""
    return not is_worker(config) and config.pluginmanager.getplugin("dsession") is not None


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def unit_of(item: pytest.Item) -> str:
    """The item's ``xdist_group`` (the first mark's name, as xdist reads it), else its module."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return module_of(item)


def without_group(nodeid: str) -> str:
    """A node id without the ``@group`` xdist's ``loadgroup`` appends on its workers (an ``@`` inside a
    parametrization's brackets is the test's own)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def slow_seconds(item: pytest.Item) -> float:
    """The rough serial seconds of a ``slow`` mark (``pytest.mark.slow(200)``), 60 when unnamed, else 0."""
    mark = item.get_closest_marker("slow")
    if mark is None:
        return 0.0
    return float(mark.args[0]) if mark.args else 60.0


# tryfirst: the groups and the order are made before anything reads them (xdist's worker appends the
# ``@group`` to the node ids in its own, plain pytest_collection_modifyitems)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(module_of(item)))
    modules: dict[tuple[str, str], float] = {}  # (unit, module): its slow seconds
    for item in items:
        key = (unit_of(item), module_of(item))
        modules[key] = max(modules.get(key, 0.0), slow_seconds(item))
    seconds: dict[str, float] = {}
    for (unit, _), module_seconds in modules.items():
        seconds[unit] = seconds.get(unit, 0.0) + module_seconds
    order = {id(item): index for index, item in enumerate(items)}
    # the slowest units first, each in its own order; the serial group last, in its own order
    items.sort(key=lambda item: (serial_rank(item), -seconds[unit_of(item)], order[id(item)]))


class WorkerLeavesTheSerialGroup:
    """On a worker: the serial group's tests leave its collection (the controller runs them later)."""

    # trylast: after -m and -k deselected what the run does not want
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        serial = [item for item in items if serial_rank(item)]
        if serial:
            nodeids = [without_group(item.nodeid) for item in serial]
            config.workeroutput["serial_nodeids"] = nodeids  # type: ignore[attr-defined]
            config.hook.pytest_deselected(items=serial)
            items[:] = [item for item in items if not serial_rank(item)]


#: the CPU niceness of a worker's other tests while a browser test may run beside them (the lab, chromium and
#: the page's timers starve first on a loaded machine: a theme stylesheet that fails to load, a toast late)
OTHERS_NICENESS = 5


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """On a worker, browser tests (and the servers, labs and kernels they start) run at the default CPU
    priority, every other test at OTHERS_NICENESS: what the lab and chromium need comes first. (Root may
    lower a niceness again; anyone else keeps the first one.)"""
    if not is_worker(item.config) or not hasattr(os, "setpriority"):
        return
    wanted = 0 if item.get_closest_marker("browser") is not None else OTHERS_NICENESS
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != wanted:
            os.setpriority(os.PRIO_PROCESS, 0, wanted)
    except OSError:
        pass


class PlainNodeIds:
    """The controller's side: a report's node id loses the ``@group`` the workers' xdist gave it, so the
    output, the summary and the durations name each test as ``python -m pytest <nodeid>`` takes it."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        report.nodeid = without_group(report.nodeid)


class SerialGroup:
    """The controller's side: collects the workers' serial node ids, runs them once the workers end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.nodeids: list[str] = []

    @pytest.hookimpl
    def pytest_testnodedown(self, node, error) -> None:
        for nodeid in getattr(node, "workeroutput", {}).get("serial_nodeids", []):
            if nodeid not in self.nodeids:
                self.nodeids.append(nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        result = yield
        if self.nodeids and not (session.shouldfail or session.shouldstop):
            self.run(session)
        return result

    def run(self, session: pytest.Session) -> None:
        hook = self.config.hook
        session.testscollected += len(self.nodeids)
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            reporter.line("")
            reporter.write_sep("-", f"serial group: {len(self.nodeids)} tests, alone, after the workers")
        ARTIFACTS.mkdir(exist_ok=True)
        log_path = ARTIFACTS / "serial-group.log"
        read_end, write_end = os.pipe()
        env = {**os.environ, REPORTS_FD: str(write_end), "TAI_SANDBOX_TEST_PART": PART}
        env.pop("PYTEST_XDIST_WORKER", None)
        command = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", *self.nodeids]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                pass_fds=(write_end,),
            )
            os.close(write_end)
            seen: set[str] = set()
            try:
                with os.fdopen(read_end, "r") as reports:
                    for line in reports:
                        report = hook.pytest_report_from_serializable(
                            config=self.config, data=json.loads(line)
                        )
                        if report.when == "setup":
                            hook.pytest_runtest_logstart(nodeid=report.nodeid, location=report.location)
                        hook.pytest_runtest_logreport(report=report)
                        if report.when == "teardown":
                            hook.pytest_runtest_logfinish(nodeid=report.nodeid, location=report.location)
                            seen.add(report.nodeid)
                returncode = process.wait()
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        unreported = [nodeid for nodeid in self.nodeids if nodeid not in seen]
        if unreported or returncode not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            tail = Path(log_path).read_text(errors="replace")[-6000:]
            report_failure(
                self.config,
                "tests/support/scheduling.py::the_serial_group_ran",
                f"the serial group's pytest exited {returncode}; tests it never reported: {unreported}\n"
                f"its output ({log_path}):\n{tail}",
            )


def report_failure(config: pytest.Config, nodeid: str, message: str) -> None:
    """A failed pseudo-test in this run's output and summary (it fails the exit status)."""
    path = nodeid.split("::", 1)[0]
    location = (path, 0, nodeid.split("::", 1)[1])
    report = pytest.TestReport(nodeid, location, {}, "failed", message, "call")
    config.hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
    config.hook.pytest_runtest_logreport(report=report)
    config.hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)


class ReportsToController:
    """The serial group's side: every report also goes, serialized, to the controller's pipe."""

    def __init__(self, config: pytest.Config, fd: int) -> None:
        self.config = config
        self.out = os.fdopen(fd, "w", buffering=1)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.out.write(json.dumps(data) + "\n")

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self) -> None:
        self.out.close()


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and the children it has reaped (servers, labs, chromium, kernels)."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


class PhaseCpu:
    """On a worker: each report carries the CPU seconds its phase cost the worker's process tree
    (``user_properties`` travel to the controller). A module's servers count where they are reaped, at its
    last teardown; the engine's own CPU (dockerd, containerd, the sessions) is not in it."""

    def __init__(self) -> None:
        self.mark = tree_cpu_seconds()

    @pytest.hookimpl
    def pytest_runtest_logstart(self) -> None:
        self.mark = tree_cpu_seconds()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        report = yield
        now = tree_cpu_seconds()
        report.user_properties.append(("cpu_seconds", round(now - self.mark, 2)))
        self.mark = now
        return report


def busy_cpu_seconds() -> tuple[float, float]:
    """The machine's (busy, all) CPU seconds since boot, from /proc/stat ((0, 0) where there is none)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(n) for n in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


class Timeline:
    """The controller's record of where the wall time went, for whoever tunes the schedule: one line per
    test phase in tests/artifacts/timeline.tsv (worker, phase, start and stop seconds into the run, the CPU
    seconds of the worker's process tree in it, node id), the machine's CPU every 10 s in
    tests/artifacts/cpu.tsv (tests/support/machine_cpu.py), and a summary line: when each worker went idle,
    how busy the machine's CPUs were, and how much of that the workers' own trees, the engine's containers
    and daemons and the kernel account for."""

    def __init__(self) -> None:
        self.started = time.time()
        self.cpu_before = busy_cpu_seconds()
        self.idle_at: dict[str, float] = {}
        self.tests_cpu = 0.0
        ARTIFACTS.mkdir(exist_ok=True)
        self.out = open(ARTIFACTS / "timeline.tsv", "w", buffering=1)  # noqa: SIM115 (closed at the end)
        self.machine = MachineCpu(ARTIFACTS / "cpu.tsv")
        self.machine.start()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        worker = getattr(getattr(report, "node", None), "gateway", None)
        name = worker.id if worker is not None else PART
        start, stop = (getattr(report, key, 0.0) - self.started for key in ("start", "stop"))
        self.idle_at[name] = max(self.idle_at.get(name, 0.0), stop)
        cpu = dict(report.user_properties).get("cpu_seconds", 0.0)
        self.tests_cpu += cpu
        self.out.write(f"{name}\t{report.when}\t{start:.1f}\t{stop:.1f}\t{cpu:.2f}\t{report.nodeid}\n")

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        busy, total = (
            after - before for after, before in zip(busy_cpu_seconds(), self.cpu_before, strict=True)
        )
        idle = ", ".join(f"{name} {seconds / 60:.1f}" for name, seconds in sorted(self.idle_at.items()))
        share = f"{100 * busy / total:.0f}%" if total else "unknown"
        where = self.machine.stop()
        terminalreporter.write_line(
            f"timeline (tests/artifacts/timeline.tsv): last test done, minutes into the run: {idle}; "
            f"the machine's CPUs were busy {share} of the run ({busy:.0f} CPU s, {self.tests_cpu:.0f} of them "
            f"in the test processes' own trees)"
        )
        terminalreporter.write_line(
            "machine CPU (tests/artifacts/cpu.tsv), CPU s: "
            + ", ".join(
                f"{key} {where[key]:.0f}" for key in ("user", "nice", "system", "irq", "steal", "idle")
            )
            + f"; of the busy: the engine's containers {where['containers']:.0f}, its daemons "
            f"{where['engine']:.0f}, the kernel's threads {where['kernel_threads']:.0f}"
        )
        self.out.close()


def pytest_sessionstart(session: pytest.Session) -> None:
    # here, not in pytest_configure: xdist registers its controller in a trylast pytest_configure
    if is_controller(session.config):
        session.config.pluginmanager.register(PlainNodeIds(), "tai-plain-nodeids")
        session.config.pluginmanager.register(SerialGroup(session.config), "tai-serial-group")
        session.config.pluginmanager.register(Timeline(), "tai-timeline")


def pytest_configure(config: pytest.Config) -> None:
    if is_worker(config):
        config.pluginmanager.register(WorkerLeavesTheSerialGroup(), "tai-worker-serial-group")
        config.pluginmanager.register(PhaseCpu(), "tai-phase-cpu")
    elif os.environ.get(REPORTS_FD):
        config.pluginmanager.register(PhaseCpu(), "tai-phase-cpu")
        fd = int(os.environ.pop(REPORTS_FD))  # not to the servers and kernels the tests start
        config.pluginmanager.register(ReportsToController(config, fd), "tai-serial-reports")
