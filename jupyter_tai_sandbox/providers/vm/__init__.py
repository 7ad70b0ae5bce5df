"""The vm provider (``vm``): a QEMU microVM per session."""

from .sandbox import VM_IMAGE, VmSandbox

__all__ = ["VM_IMAGE", "VmSandbox"]
