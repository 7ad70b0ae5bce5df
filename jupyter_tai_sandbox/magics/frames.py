"""pandas DataFrames across the %%sandbox handoff, as Parquet (pyarrow), without pickle's same-version trap.

``--in df`` of a DataFrame writes ``.sandbox/in/df.parquet`` when pyarrow imports in the
kernel (``$df`` names it); otherwise, or when Parquet cannot hold the frame, the value goes
as before (JSON, else a pickle) and one line on stderr says why. ``--out-df VAR[=PATH]``
reads the Parquet file the cell wrote (PATH in the workspace, by default
``.sandbox/out/VAR.parquet``, whose full path the cell finds in ``$VAR``) back into a
DataFrame; it needs pandas and pyarrow in the kernel and says so before the cell runs.
"""

from __future__ import annotations

import io
import sys
from typing import Any

from .options import HANDOFF_DIR, SandboxMagicError, identifier, serialise


def _pandas() -> Any:
    """pandas when the kernel has imported it (a DataFrame exists only then), else None."""
    return sys.modules.get("pandas")


def _pyarrow_missing() -> str | None:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        return f"pyarrow is not importable in the kernel ({e.msg}; pip install pyarrow)"
    return None


def is_frame(value: Any) -> bool:
    pandas = _pandas()
    return pandas is not None and isinstance(value, pandas.DataFrame)


def serialise_input(name: str, value: Any, say: Any = None) -> tuple[str, bytes]:
    """(extension, bytes) of ``--in name``: Parquet for a DataFrame when it can, else JSON or pickle."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if is_frame(value):
        why = _pyarrow_missing()
        if why is None:
            buffer = io.BytesIO()
            try:
                value.to_parquet(buffer, engine="pyarrow")
                return "parquet", buffer.getvalue()
            except Exception as e:  # an object column Arrow cannot type, non-string column names...
                why = f"Parquet cannot hold this DataFrame ({type(e).__name__}: {str(e)[:200]})"
        ext, data = serialise(name, value)
        say(
            f"sandbox: --in {name}: {why}: sent as a {'pickle' if ext == 'pkl' else ext.upper()} instead "
            "(reading it needs the same pandas version in the session)"
        )
        return ext, data
    return serialise(name, value)


def out_frame_targets(specs: list[str] | None) -> list[tuple[str, str]]:
    """``--out-df VAR[=PATH]`` options as (VAR, workspace path); refused at once when the kernel cannot
    read Parquet into a DataFrame."""
    targets = []
    for spec in specs or []:
        var, sep, path = spec.partition("=")
        identifier(var, "--out-df")
        if sep and not path:
            raise SandboxMagicError(
                f"--out-df {spec}: give a workspace path after '=', e.g. {var}=result.parquet"
            )
        targets.append((var, path or f"{HANDOFF_DIR}/out/{var}.parquet"))
    if targets:
        why: str | None = "pandas is not importable in the kernel (pip install pandas)"
        try:
            import pandas  # noqa: F401
        except ImportError:
            pass
        else:
            why = _pyarrow_missing()
        if why is not None:
            raise SandboxMagicError(
                f"--out-df reads a Parquet file into a DataFrame, but {why}; without them, capture text "
                "with --out VAR (for example JSON the cell prints)"
            )
    return targets


def read_frame(data: bytes) -> Any:
    import pandas

    return pandas.read_parquet(io.BytesIO(data), engine="pyarrow")
