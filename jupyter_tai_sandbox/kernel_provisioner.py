"""The provisioner's old path, for installs whose entry-point metadata still names it (an editable install made
before the kernels/ package: ``jupyter_client.kernel_provisioners`` there says ``kernel_provisioner:SandboxProvisioner``
until it is reinstalled). New installs find it at :mod:`jupyter_tai_sandbox.kernels.provisioner`."""

from .kernels.provisioner import SandboxProvisioner as SandboxProvisioner
