"""The Jupyter config a server would read, for the doors that run outside one (the CLI, kernels under nbclient)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .contract import SandboxError


def load_server_config(extra_file: str | None = None) -> Any:
    """The Jupyter config the server would read: jupyter_server_config.{json,py} on the config path,
    then ``extra_file`` (the CLI's ``--config``), which wins."""
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config import Config
    from traitlets.config.application import Application

    loader = Application(log_level="ERROR")
    loader.load_config_file("jupyter_server_config", path=jupyter_config_path())
    config = Config(loader.config)
    if extra_file:
        path = Path(extra_file)
        if not path.is_file():
            raise SandboxError(f"--config {extra_file}: no such file")
        extra = Application(log_level="ERROR")
        extra.load_config_file(path.name, path=[str(path.parent.resolve())])
        config.merge(extra.config)
    return config
