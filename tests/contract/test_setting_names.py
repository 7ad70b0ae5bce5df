"""Every numeric setting says its unit in its name (``*_seconds``, ``*_bytes``, ``*_mb`` as the seeds'
``memory_mb``), or is a count or a fraction; no unit-less timeout, interval, size or limit."""

import re

from traitlets import Float, Integer

from jupyter_tai_sandbox.app import SandboxApp, _provider_classes
from jupyter_tai_sandbox.kernels.provisioner import SandboxProvisioner

#: a name that hides its unit: a bare duration, a buffer size, or a limit of something measured (pool_size is a count)
UNITLESS = re.compile(r"(_timeout|_interval|_hours|_minutes|_pipe_size|_memory_limit|_delay)$")


def numeric_settings():
    for cls in [SandboxApp, SandboxProvisioner, *_provider_classes()]:
        for name, trait in cls.class_traits(config=True).items():
            if isinstance(trait, (Float, Integer)):
                yield f"{cls.__name__}.{name}"


def test_no_numeric_setting_hides_its_unit():
    names = list(numeric_settings())
    assert len(names) > 40  # the classes were all read
    assert [n for n in names if UNITLESS.search(n)] == []


def test_durations_are_seconds_and_sizes_bytes_or_mib():
    names = set(numeric_settings())
    for expected in (
        "SandboxApp.reap_interval_seconds",
        "SandboxProvisioner.start_timeout_seconds",
        "LocalSandbox.output_memory_bytes",
        "VmSandbox.root_disk_idle_seconds",
        "DockerSandbox.max_memory_mb",
    ):
        assert expected in names, expected
