"""The preset store: presets authored at run time, in one JSON file replaced atomically.

``{"version": 1, "presets": {name: definition}, "private": {author: {name: definition}}}``:
``presets`` are the shared ones (authored by admins and the operator, listed to every
user), ``private`` the ones each user authored for themselves (listed to their author only).
A store without ``private`` (written before it existed) holds shared presets only.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import PresetStoreError

STORE_VERSION = 1


def default_store_path() -> Path:
    """``<jupyter data dir>/tai_sandbox/presets.json`` (JUPYTER_DATA_DIR moves it)."""
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "tai_sandbox" / "presets.json"


class PresetStore:
    """Presets authored at run time, in one JSON file replaced atomically on every change."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path else default_store_path()
        self._cache: tuple[tuple[int, int], dict[str, Any]] | None = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialize read-modify-write between processes (the server and the CLI)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: atomic replace only
            yield
            return
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _load_all(self) -> dict[str, Any]:
        """``{"presets": {...}, "private": {...}}`` as stored (a copy)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {"presets": {}, "private": {}}
        stamp = (stat.st_mtime_ns, stat.st_size)
        if self._cache is not None and self._cache[0] == stamp:
            return copy.deepcopy(self._cache[1])
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PresetStoreError(f"cannot read the preset store {self.path}: {e}") from None
        presets = data.get("presets") if isinstance(data, dict) else None
        if not isinstance(presets, dict):
            raise PresetStoreError(f"the preset store {self.path} is not a {{'presets': {{...}}}} object")
        private = data.get("private", {})
        if not isinstance(private, dict) or not all(isinstance(v, dict) for v in private.values()):
            raise PresetStoreError(
                f"the preset store {self.path}: 'private' is not an {{author: {{...}}}} object"
            )
        whole = {"presets": presets, "private": private}
        self._cache = (stamp, whole)
        return copy.deepcopy(whole)

    def load(self) -> dict[str, dict[str, Any]]:
        """The shared presets: name -> stored definition (as written; validated by the registry)."""
        return self._load_all()["presets"]

    def load_private(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every author's private presets: author -> name -> stored definition."""
        return self._load_all()["private"]

    def save(
        self,
        presets: Mapping[str, Mapping[str, Any]],
        private: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    ) -> None:
        """Write the whole store to a temporary file beside it, fsync, then rename over it.

        ``private`` None keeps the private presets as stored (call it holding :meth:`locked`).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if private is None:
            private = self.load_private()
        whole: dict[str, Any] = {"version": STORE_VERSION, "presets": presets}
        if any(private.values()):
            whole["private"] = {author: dict(p) for author, p in private.items() if p}
        text = json.dumps(whole, indent=2, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".presets-", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, OSError):
                raise PresetStoreError(f"cannot write the preset store {self.path}: {e}") from None
            raise
        self._cache = None
