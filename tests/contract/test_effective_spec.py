"""SandboxPolicy.effective_spec: the one place a request becomes the spec a provider must honour (owner and
consumer, TTL, floor, ceiling, credentials, and the provider's limits and defaults as data)."""

import pytest

from jupyter_tai_sandbox.contract import (
    DEFAULT_TTL_SECONDS,
    NETWORK_ORDER,
    SandboxForbiddenError,
    SandboxSpecRejectedError,
    SessionLimits,
    SessionSpec,
)
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.sessions import Caller

ALICE = Caller("alice")
ADMIN = Caller("root", frozenset({"write"}))

CONTAINERS = SessionLimits(
    kind="docker",
    settings="DockerSandbox",
    max_isolation="container",
    networks=frozenset(NETWORK_ORDER),
    supports_limits=True,
    min_cpu=0.01,
    min_memory_mb=6,
    floor_owner="the Docker engine",
    max_cpu=2.0,
    max_memory_mb=4096,
    default_cpu=1.0,
    default_memory_mb=1024,
    default_image="jupyter-tai-sandbox/minimal:latest",
    images=("jupyter-tai-sandbox/minimal", "registry.example.com/team/*"),
    images_setting="DockerSandbox.allowed_images",
)


def effective(spec=None, caller=None, limits=CONTAINERS, **policy):
    return SandboxPolicy(**policy).effective_spec(spec or SessionSpec(), limits, caller)


def test_a_callers_spec_is_theirs_with_their_consumer_label_and_the_providers_defaults():
    spec = effective(SessionSpec(), ALICE)
    assert (spec.owner, spec.consumer) == ("alice", "user:alice")
    assert (spec.cpu, spec.memory_mb, spec.image) == (1.0, 1024, "jupyter-tai-sandbox/minimal:latest")
    assert spec.isolation == "container" and spec.ttl_seconds == DEFAULT_TTL_SECONDS


def test_naming_another_owner_or_consumer_is_an_admin_act():
    with pytest.raises(SandboxForbiddenError, match="another owner"):
        effective(SessionSpec(owner="bob"), ALICE)
    with pytest.raises(SandboxForbiddenError, match="naming another"):
        effective(SessionSpec(consumer="user:bob"), ALICE)
    assert effective(SessionSpec(consumer="user:alice/kernel:1"), ALICE).consumer == "user:alice/kernel:1"
    admin = effective(SessionSpec(owner="bob", consumer="tool:agent"), ADMIN)
    assert (admin.owner, admin.consumer) == ("bob", "tool:agent")


def test_an_image_off_the_list_is_refused_to_a_user_but_not_to_an_admin_or_the_python_api():
    with pytest.raises(SandboxForbiddenError, match=r"DockerSandbox\.allowed_images"):
        effective(SessionSpec(image="busybox"), ALICE)
    assert effective(SessionSpec(image="registry.example.com/team/tool:2"), ALICE).image.endswith("tool:2")
    assert effective(SessionSpec(image="busybox"), ADMIN).image == "busybox"
    assert effective(SessionSpec(image="busybox")).image == "busybox"


def test_an_unset_ttl_is_the_operators_maximum_when_that_is_lower_and_a_named_one_over_it_is_refused():
    assert effective(max_ttl_seconds=600).ttl_seconds == 600
    assert effective(SessionSpec(ttl_seconds=300), max_ttl_seconds=600).ttl_seconds == 300
    with pytest.raises(SandboxSpecRejectedError, match="max_ttl_seconds"):
        effective(SessionSpec(ttl_seconds=900), max_ttl_seconds=600)


def test_the_providers_bounds_refuse_and_never_clamp():
    for spec, words in [
        (SessionSpec(cpu=3.0), r"over the operator's maximum of 2 CPUs \(DockerSandbox\.max_cpu\)"),
        (SessionSpec(cpu=0.001), "under the Docker engine's minimum"),
        (SessionSpec(memory_mb=8192), r"DockerSandbox\.max_memory_mb"),
        (SessionSpec(isolation="vm"), "vm"),
    ]:
        with pytest.raises(SandboxSpecRejectedError, match=words):
            effective(spec)


def test_whole_vcpus_and_only_listed_images_bind_everyone():
    vm = SessionLimits(
        kind="vm",
        settings="VmSandbox",
        max_isolation="vm",
        networks=frozenset({"none"}),
        supports_limits=True,
        min_cpu=1.0,
        whole_cpus=True,
        default_image="tai-vm",
        images=("tai-vm",),
        images_setting="VmSandbox.images",
        only_listed_images=True,
    )
    with pytest.raises(SandboxSpecRejectedError, match="whole vCPUs"):
        effective(SessionSpec(cpu=1.5, network="none"), limits=vm)
    with pytest.raises(SandboxSpecRejectedError, match=r"one in VmSandbox\.images"):
        effective(SessionSpec(image="python:3.11", network="none"), ADMIN, limits=vm)
    assert effective(SessionSpec(network="none"), limits=vm).image == "tai-vm"


def test_a_provider_without_limits_refuses_caps_rather_than_run_uncapped():
    with pytest.raises(SandboxSpecRejectedError, match="cannot enforce cpu/memory_mb caps"):
        effective(SessionSpec(cpu=1.0), limits=LocalSandbox().session_limits(), isolation="none")


def test_deciding_a_decided_spec_changes_nothing(monkeypatch):
    monkeypatch.setenv("AGENT_TOKEN", "tok")
    policy = SandboxPolicy(credentials={"user:alice": ["AGENT_TOKEN"]}, max_ttl_seconds=600)
    once = policy.effective_spec(SessionSpec(env={"A": "1"}), CONTAINERS, ALICE)
    assert once.env == {"A": "1", "AGENT_TOKEN": "tok"}
    assert policy.effective_spec(once, CONTAINERS, ALICE) == once
    assert policy.effective_spec(once, CONTAINERS) == once
