"""The ``vm`` sandbox's guest: one QEMU microVM per session with the session agent as its PID 1, reached over
a virtio-serial port (agent/PROTOCOL.md, "Over a VM's port").

``build`` builds the kernel and initramfs offline from Debian packages and caches them, ``qemu`` boots one and
connects to its agent, ``probe`` says whether KVM works here (TCG is emulation, reported as such).
``python -m jupyter_tai_sandbox.providers.vm.guest build | probe`` runs the first and the last.
"""

from .build import Guest, GuestBuildError, build_guest, cache_dir
from .probe import probe
from .qemu import BootedVm, VmError, boot

__all__ = ["BootedVm", "Guest", "GuestBuildError", "VmError", "boot", "build_guest", "cache_dir", "probe"]
