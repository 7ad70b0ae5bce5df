"""Settings every provider that runs sessions apart from the server shares: its deployment scope and its
cpu and memory limits (docker and swarm through the container base, and vm)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from traitlets import Dict, Float, Integer, TraitError, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from ..contract import SandboxSpecRejectedError, SessionSpec
from ._docker_names import DEPLOYMENT_ENV, Deployment, check_deployment, default_deployment


def rejected(message: str) -> SandboxSpecRejectedError:
    return SandboxSpecRejectedError(message)


class DeploymentSettings(LoggingConfigurable):
    """The deployment a provider works in, and the labels on everything it makes."""

    extra_labels = Dict(
        value_trait=Unicode(),
        help="""Extra labels put on every session this provider makes, and on its workspaces (decoration:
        what a provider sees is set by `deployment`, not by these).""",
    ).tag(config=True)

    deployment = Unicode(
        help=f"""The deployment this provider works in (${DEPLOYMENT_ENV}): a label on every session,
        workspace, network and record it makes, and a filter on every query, so two deployments on one
        engine or host never see, reap or touch each other's sessions, workspaces or networks, and admin
        rights stop at the deployment. Default: 'user@host:config dir' of the server (the JupyterHub user when
        JUPYTERHUB_USER is set, else the OS user; Jupyter's config dir), which a restarted server finds
        again. Servers that should share sessions (several processes of one service) name the same
        deployment explicitly.""",
    ).tag(config=True)

    @default("deployment")
    def _deployment_default(self) -> str:
        return os.environ.get(DEPLOYMENT_ENV, "").strip() or default_deployment()

    @validate("deployment")
    def _check_deployment(self, proposal: Any) -> str:
        try:
            return check_deployment(proposal["value"])
        except ValueError as e:
            raise TraitError(f"{type(self).__name__}.deployment: {e}") from None

    @property
    def scope(self) -> Deployment:
        """The deployment this provider works in."""
        return Deployment(self.deployment)

    @property
    def own_labels(self) -> dict[str, str]:
        """The labels on everything this provider makes: ``extra_labels`` and the deployment's."""
        return {**self.extra_labels, **self.scope.labels}


class LimitSettings(LoggingConfigurable):
    """A session's cpu and memory: the defaults a spec without them gets, and the most a spec may ask for."""

    #: the least a spec may ask for, and who sets that floor (a provider's own)
    min_cpu = 0.01
    min_memory_mb = 6
    limits_floor = "the Docker engine"

    default_cpu = Float(
        1.0, help="CPUs a session gets when its spec names none (0: no limit)."
    ).tag(config=True)

    max_cpu = Float(
        2.0, help="Most CPUs a spec may ask for; more is rejected (0: no maximum but the engine's)."
    ).tag(config=True)

    default_memory_mb = Integer(
        1024, help="Memory (MiB) a session gets when its spec names none (0: no limit)."
    ).tag(config=True)

    max_memory_mb = Integer(
        4096, help="Most memory (MiB) a spec may ask for; more is rejected (0: no maximum)."
    ).tag(config=True)

    def _limited(self, spec: SessionSpec) -> SessionSpec:
        """The spec with the operator's cpu and memory limits in force; out-of-range asks are rejected."""
        max_cpu, max_mem, name = self.max_cpu, self.max_memory_mb, type(self).__name__
        if spec.cpu is not None:
            if spec.cpu < self.min_cpu:
                raise rejected(f"cpu: {spec.cpu:g} is under {self.limits_floor}'s minimum of {self.min_cpu:g} CPU")
            if max_cpu > 0 and spec.cpu > max_cpu:
                raise rejected(f"cpu: {spec.cpu:g} is over the operator's maximum of {max_cpu:g} CPUs ({name}.max_cpu)")
        if spec.memory_mb is not None:
            if spec.memory_mb < self.min_memory_mb:
                raise rejected(
                    f"memory_mb: {spec.memory_mb} is under {self.limits_floor}'s minimum of {self.min_memory_mb} MiB")
            if max_mem > 0 and spec.memory_mb > max_mem:
                raise rejected(
                    f"memory_mb: {spec.memory_mb} is over the operator's maximum of {max_mem} MiB ({name}.max_memory_mb)"
                )
        cpu, memory = spec.cpu, spec.memory_mb
        if cpu is None and self.default_cpu > 0:
            cpu = min(self.default_cpu, max_cpu) if max_cpu > 0 else self.default_cpu
        if memory is None and self.default_memory_mb > 0:
            memory = min(self.default_memory_mb, max_mem) if max_mem > 0 else self.default_memory_mb
        if (cpu, memory) == (spec.cpu, spec.memory_mb):
            return spec
        return dataclasses.replace(spec, cpu=cpu, memory_mb=memory)
