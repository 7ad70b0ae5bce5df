"""What a provider can give a session, as data: its isolation and networks, its cpu and memory bounds and
defaults, its images.

A provider answers :meth:`Sandbox.session_limits` with one :class:`SessionLimits`: data, no decision. The
policy (:meth:`jupyter_tai_sandbox.policy.SandboxPolicy.effective_spec`) turns a request into the spec the
provider must honour with it, and a provider handed a spec directly (the conformance suite does) runs the
policy's :func:`~jupyter_tai_sandbox.policy.within_limits` itself: on a decided spec it changes nothing.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


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
    #: whether it enforces a spec's egress policy (SessionSpec.egress), and its words when it cannot
    egress_policy: bool = False
    egress_refusal: str = ""
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
