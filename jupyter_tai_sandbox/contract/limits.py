"""What a provider can give a session, as data: its isolation and networks, its cpu and memory bounds and
defaults, its images.

A provider answers :meth:`Sandbox.session_limits` with one :class:`SessionLimits`; the policy
(:meth:`jupyter_tai_sandbox.policy.SandboxPolicy.effective_spec`) turns a request into the spec the provider
must honour with it, and a provider handed a spec directly (the conformance suite does) runs
:meth:`SessionLimits.apply` itself: on a spec the policy decided it changes nothing.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass

from .errors import SandboxSpecRejectedError, isolation_floor_refusal
from .values import SessionSpec, isolation_rank


def normal_image(ref: str) -> str:
    """``name`` as ``name:latest`` (a reference with a tag, a digest or a glob is left as it is)."""
    if "@" in ref or any(c in ref for c in "*?[") or ":" in ref.rsplit("/", 1)[-1]:
        return ref
    return ref + ":latest"


@dataclass(frozen=True)
class SessionLimits:
    """One provider's bounds and defaults for a session. Zero means "none" for a maximum or a default."""

    #: the provider's kind, named in refusals
    kind: str
    #: the section of the provider's settings, named in refusals (``DockerSandbox``)
    settings: str
    #: the strongest isolation the provider gives, and the networks it can honour
    max_isolation: str = "none"
    networks: frozenset[str] = frozenset({"egress"})
    #: whether cpu / memory_mb caps can be enforced (else a capped spec is refused, never run uncapped)
    supports_limits: bool = False
    #: the least a spec may ask for, and who sets that floor
    min_cpu: float = 0.0
    min_memory_mb: int = 0
    floor_owner: str = "the provider"
    #: the operator's maxima and the defaults of a spec that names none
    max_cpu: float = 0.0
    max_memory_mb: int = 0
    default_cpu: float = 0.0
    default_memory_mb: int = 0
    #: cpu in whole units only (vCPUs)
    whole_cpus: bool = False
    #: the image of a spec that names none (None: the provider has no image choice)
    default_image: str | None = None
    #: the images (globs) a caller who is not an admin may ask for; None: any
    images: tuple[str, ...] | None = None
    #: the setting that lists them, named in refusals
    images_setting: str = ""
    #: the provider runs no image but these, whoever asks (a vm's root disks), not only for non-admins
    only_listed_images: bool = False

    def image_allowed(self, image: str | None) -> bool:
        """Whether ``image`` is on the list (None, the default, always is)."""
        if image is None or self.images is None:
            return True
        wanted = normal_image(image)
        return any(fnmatch.fnmatchcase(wanted, normal_image(p)) for p in self.images)

    def apply(self, spec: SessionSpec) -> SessionSpec:
        """``spec`` within these limits: what the provider cannot honour is refused loudly (never downgraded),
        an unset cpu, memory or image gets its default. Applying it twice changes nothing."""
        wanted = spec.isolation or self.max_isolation
        if isolation_rank(wanted) > isolation_rank(self.max_isolation):
            raise isolation_floor_refusal(self.kind, self.max_isolation, wanted)
        if spec.network not in self.networks:
            raise SandboxSpecRejectedError(
                f"the {self.kind} provider cannot honour network={spec.network!r}; it supports "
                f"{', '.join(sorted(self.networks))}"
            )
        if not self.supports_limits:
            if spec.cpu is not None or spec.memory_mb is not None:
                raise SandboxSpecRejectedError(
                    f"the {self.kind} provider cannot enforce cpu/memory_mb caps and never runs a capped "
                    "request uncapped: drop the caps or use a container provider"
                )
        else:
            spec = self._capped(spec)
        if self.only_listed_images and not self.image_allowed(spec.image):
            raise SandboxSpecRejectedError(
                f"image: {str(spec.image)[:100]!r} is not one of the {self.kind} provider's images "
                f"({self.default_image}, or one in {self.images_setting})"
            )
        if spec.image is None and self.default_image is not None:
            spec = dataclasses.replace(spec, image=self.default_image)
        return spec

    def _capped(self, spec: SessionSpec) -> SessionSpec:
        max_cpu, max_mem = self.max_cpu, self.max_memory_mb
        if spec.cpu is not None:
            if spec.cpu < self.min_cpu:
                raise SandboxSpecRejectedError(
                    f"cpu: {spec.cpu:g} is under {self.floor_owner}'s minimum of {self.min_cpu:g} CPU"
                )
            if max_cpu > 0 and spec.cpu > max_cpu:
                raise SandboxSpecRejectedError(
                    f"cpu: {spec.cpu:g} is over the operator's maximum of {max_cpu:g} CPUs ({self.settings}.max_cpu)"
                )
        if spec.memory_mb is not None:
            if spec.memory_mb < self.min_memory_mb:
                raise SandboxSpecRejectedError(
                    f"memory_mb: {spec.memory_mb} is under {self.floor_owner}'s minimum of {self.min_memory_mb} MiB"
                )
            if max_mem > 0 and spec.memory_mb > max_mem:
                raise SandboxSpecRejectedError(
                    f"memory_mb: {spec.memory_mb} is over the operator's maximum of {max_mem} MiB "
                    f"({self.settings}.max_memory_mb)"
                )
        cpu, memory = spec.cpu, spec.memory_mb
        if cpu is None and self.default_cpu > 0:
            cpu = min(self.default_cpu, max_cpu) if max_cpu > 0 else self.default_cpu
        if memory is None and self.default_memory_mb > 0:
            memory = min(self.default_memory_mb, max_mem) if max_mem > 0 else self.default_memory_mb
        if self.whole_cpus and cpu is not None and cpu != int(cpu):
            raise SandboxSpecRejectedError(f"cpu: {cpu:g}: the {self.kind} provider gives whole vCPUs")
        if (cpu, memory) == (spec.cpu, spec.memory_mb):
            return spec
        return dataclasses.replace(spec, cpu=cpu, memory_mb=memory)
