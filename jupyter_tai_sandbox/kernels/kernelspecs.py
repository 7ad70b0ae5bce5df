"""Kernelspecs for sandboxed kernels: write, list and remove them (``jupyter tai-sandbox kernelspec``).

A sandboxed kernelspec is an ordinary ``kernel.json`` whose ``metadata.kernel_provisioner``
names :data:`~jupyter_tai_sandbox.kernels.provisioner.PROVISIONER_NAME` with the session's
settings, and ``interrupt_mode: message`` (ipykernel interrupts itself when asked on the
control channel, so no signal has to cross the seam).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import Any

from ..images import PYTHON_IMAGE
from .provisioner import PROVISIONER_NAME

DEFAULT_NAME = "python3-sandbox"
DEFAULT_DISPLAY_NAME = "Python 3 (sandbox)"
KERNEL_ARGV = ["python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
NETWORKS = ("auto", "none", "internal", "egress")


def kernelspec_json(
    *,
    display_name: str = DEFAULT_DISPLAY_NAME,
    image: str | None = PYTHON_IMAGE,
    network: str = "auto",
    workspace_key: str | None = None,
    cpu: float | None = None,
    memory_mb: int | None = None,
    ttl_seconds: float | None = None,
    isolation: str | None = None,
    provider: str | None = None,
    egress_allow: list[str] | None = None,
    egress_deny: list[str] | None = None,
) -> dict[str, Any]:
    """The kernel.json of a sandboxed Python kernel; unset settings are left out (the provisioner's defaults)."""
    if network not in NETWORKS:
        raise ValueError(f"network must be one of {', '.join(NETWORKS)}, not {network!r}")
    config: dict[str, Any] = {"image": image, "network": network}
    optional = {
        "workspace_key": workspace_key,
        "cpu": cpu,
        "memory_mb": memory_mb,
        "ttl_seconds": ttl_seconds,
        "isolation": isolation,
        "provider": provider,
        "egress_allow": None if egress_allow is None else list(egress_allow),
        "egress_deny": list(egress_deny) if egress_deny else None,
    }
    config.update({k: v for k, v in optional.items() if v is not None})
    if config["image"] is None:
        del config["image"]
    # validate what a session would be asked for now, not at the first kernel start
    from ..contract import EgressPolicy, SessionSpec

    ttl: dict[str, Any] = {"ttl_seconds": ttl_seconds} if ttl_seconds is not None else {}
    egress = None
    if egress_allow is not None or egress_deny:
        if network not in ("auto", "egress"):
            raise ValueError(f"an egress allow- or deny-list needs network egress (or auto), not {network!r}")
        egress = EgressPolicy(
            allow=None if egress_allow is None else tuple(egress_allow), deny=tuple(egress_deny or ())
        )
    SessionSpec(
        egress=egress,
        image=config.get("image"),
        isolation=isolation,  # type: ignore[arg-type]  # any str: SessionSpec's check of it is the point
        network="egress" if network == "auto" else network,  # type: ignore[arg-type]  # as isolation
        durability="persistent" if workspace_key else "ephemeral",
        workspace_key=workspace_key,
        cpu=cpu,
        memory_mb=memory_mb,
        **ttl,
    )
    return {
        "argv": list(KERNEL_ARGV),
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "message",
        "env": {},
        "metadata": {
            "kernel_provisioner": {"provisioner_name": PROVISIONER_NAME, "config": config},
        },
    }


def _manager() -> Any:
    from jupyter_client.kernelspec import KernelSpecManager

    return KernelSpecManager()


def _logos() -> list[str]:
    """ipykernel's logos, so the launcher shows the Python icon (when ipykernel is installed here)."""
    try:
        import ipykernel
    except ImportError:  # pragma: no cover - ipykernel is a test dependency
        return []
    folder = os.path.join(os.path.dirname(ipykernel.__file__), "resources")
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.startswith("logo-")]


def install(
    name: str = DEFAULT_NAME, *, user: bool = False, prefix: str | None = None, **settings: Any
) -> str:
    """Write the kernelspec ``name``; return the folder it was installed in.

    With neither ``user`` nor ``prefix`` it goes into the running environment (sys.prefix/share/jupyter/kernels,
    as ``jupyter kernelspec install --sys-prefix``), never a system-wide folder other environments see.
    """
    spec = kernelspec_json(**settings)
    if not user and prefix is None:
        prefix = sys.prefix
    with tempfile.TemporaryDirectory(prefix="tai-kernelspec-") as folder:
        with open(os.path.join(folder, "kernel.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f, indent=1)
        for logo in _logos():
            shutil.copy(logo, folder)
        return str(_manager().install_kernel_spec(folder, name, user=user, prefix=prefix))


def is_sandboxed(spec: dict[str, Any]) -> bool:
    provisioner = (spec.get("metadata") or {}).get("kernel_provisioner") or {}
    return provisioner.get("provisioner_name") == PROVISIONER_NAME


def list_specs() -> dict[str, dict[str, Any]]:
    """The installed sandboxed kernelspecs: name -> {"resource_dir", "spec"}."""
    found = _manager().get_all_specs()
    return {name: entry for name, entry in sorted(found.items()) if is_sandboxed(entry.get("spec", {}))}


def remove(name: str) -> str:
    """Remove the sandboxed kernelspec ``name``; return its folder. Other kernelspecs are refused."""
    from jupyter_client.kernelspec import NoSuchKernel

    manager = _manager()
    try:
        spec = manager.get_kernel_spec(name)
    except NoSuchKernel:
        raise KeyError(f"no kernelspec named {name!r}") from None
    if not is_sandboxed(spec.to_dict()):
        raise ValueError(
            f"kernelspec {name!r} is not a sandboxed kernel (it does not use {PROVISIONER_NAME})"
        )
    return str(manager.remove_kernel_spec(name))


__all__ = [
    "DEFAULT_DISPLAY_NAME",
    "DEFAULT_NAME",
    "KERNEL_ARGV",
    "install",
    "is_sandboxed",
    "kernelspec_json",
    "list_specs",
    "remove",
]
