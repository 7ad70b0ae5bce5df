"""Files a ``%%sandbox`` cell writes under ``outputs/``: found, then displayed inert.

A cell's own output is trusted by JupyterLab: ``text/html`` and ``text/markdown``
it publishes are inserted into the user's page and their scripts run with the
user's Jupyter credentials. Files written by sandboxed code are the sandbox's
words, not the user's, so by default they are never published as active content:

========== ===============================================================
PNG, JPEG  ``image/png`` / ``image/jpeg`` (an image runs nothing)
SVG        ``text/html`` holding only ``<img src="data:image/svg+xml;base64,...">``:
           an SVG shown through an ``<img>`` runs no script and loads nothing
HTML       ``text/html`` holding only an ``<iframe sandbox="" srcdoc="...">``: the
           file, escaped into the ``srcdoc`` attribute, renders in an opaque origin
           with scripts, forms, popups and navigation of the page all off (no
           ``allow-*`` token at all), and a Content-Security-Policy placed first in
           the document blocks every network load (``img-src data:`` only)
Markdown   ``text/plain``: the source as text (Markdown renders through HTML)
JSON       ``application/json`` (a data tree, no markup)
========== ===============================================================

``%%sandbox --trusted-outputs`` publishes them as before (``image/svg+xml``,
``text/html``, ``text/markdown``): only for a sandbox whose every writer you
trust, since a script in those files runs in your JupyterLab page as you (it can
open a terminal on the Jupyter host).
"""

from __future__ import annotations

import base64
import contextlib
import html
import json
import posixpath
import re
import sys
from typing import Any

from ..client import SandboxClient
from ..contract import SandboxError, SandboxNotFoundError

#: the folder of the workspace whose new or changed files are displayed after a cell
OUTPUTS_DIR = "outputs"
DISPLAY_MAX_BYTES = 10 << 20
#: files under outputs/ looked at, at most (three levels deep)
SNAPSHOT_MAX_FILES = 500

MIME_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".svg": "image/svg+xml",
    ".html": "text/html",
    ".htm": "text/html",
    ".json": "application/json",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
}

#: first in every srcdoc: the framed document loads nothing from any network
FRAME_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:"
_BLOCKS = re.compile(r"<(?:tr|p|br|li|h[1-6]|div|table|pre)\b|\n", re.I)

Snapshot = dict[str, tuple[Any, Any]]


def mime_type(name: str) -> str | None:
    """The MIME type a file under outputs/ is displayed with, or None (not displayed)."""
    return MIME_TYPES.get(posixpath.splitext(name)[1].lower())


def inert_frame(name: str, document: str) -> str:
    """An ``<iframe sandbox="">`` showing ``document``: no scripts, opaque origin, no network."""
    srcdoc = f'<meta http-equiv="Content-Security-Policy" content="{FRAME_CSP}">{document}'
    height = min(600, max(120, 40 + 24 * len(_BLOCKS.findall(document))))
    return (
        f'<div style="resize: vertical; overflow: auto; height: {height}px; border: 1px solid #ddd">'
        f'<iframe sandbox="" referrerpolicy="no-referrer" title="{html.escape(name, quote=True)}" '
        f'style="width: 100%; height: 100%; border: 0" srcdoc="{html.escape(srcdoc, quote=True)}"></iframe></div>'
    )


def inert_image(name: str, mime: str, data: bytes) -> str:
    """An ``<img>`` of ``data`` (an SVG shown this way runs no script and loads nothing)."""
    encoded = base64.b64encode(data).decode()
    return f'<img src="data:{mime};base64,{encoded}" alt="{html.escape(name, quote=True)}">'


def inert_display(name: str, data: bytes, *, trusted: bool = False) -> dict[str, Any]:
    """The mimebundle a file ``name`` under outputs/ is displayed with.

    With ``trusted=False`` (the default) nothing in it can run script in the page that
    shows it: see the module's table. ``ValueError`` for a ``.json`` file that is not
    JSON, or a file type not displayed.
    """
    mime = mime_type(name)
    if mime is None:
        raise ValueError(f"{name}: not a displayed file type")
    label = f"<sandbox {name}>"
    if mime in ("image/png", "image/jpeg"):
        return {mime: base64.b64encode(data).decode(), "text/plain": label}
    if mime == "application/json":
        return {mime: json.loads(data), "text/plain": label}
    text = data.decode(errors="replace")
    if trusted:
        return {mime: text, "text/plain": label}
    if mime == "image/svg+xml":
        return {"text/html": inert_image(name, mime, data), "text/plain": label}
    if mime == "text/html":
        return {"text/html": inert_frame(name, text), "text/plain": label}
    return {"text/plain": text}  # markdown: its source, as text


def display_outputs(shown: list[tuple[str, bytes]], *, trusted: bool = False) -> None:
    """Display files read from outputs/ in the current cell."""
    from IPython.display import display

    for path, data in shown:
        try:
            bundle = inert_display(path, data, trusted=trusted)
        except ValueError:
            print(f"sandbox: {path} is not valid JSON; not shown", file=sys.stderr)
            continue
        metadata: dict[str, Any] = {"sandbox_path": path}
        if not trusted:
            metadata["sandbox_inert"] = True
        display(bundle, raw=True, metadata=metadata)


# ------------------------------------------------------------------ finding them


async def snapshot(client: SandboxClient, session_id: str) -> Snapshot:
    """``{path: (size, mtime)}`` of the files under outputs/ (three levels, 500 entries at most).

    The workspace root is listed first and outputs/ only when it is there, so a session
    without it costs one listing that answers 200 (no 404 in the server's log).
    """
    root = await client.list_files(session_id, "")
    if not any(e.get("name") == OUTPUTS_DIR and e.get("type") in ("directory", "symlink") for e in root):
        return {}
    found: Snapshot = {}
    folders = [(OUTPUTS_DIR, 0)]
    while folders and len(found) < SNAPSHOT_MAX_FILES:
        folder, depth = folders.pop()
        try:
            entries = await client.list_files(session_id, folder + "/")
        except SandboxNotFoundError:  # removed since its parent was listed
            continue
        except SandboxError:
            if folder == OUTPUTS_DIR:
                continue  # outputs leads outside the workspace (a symlink): nothing to show
            raise
        for entry in entries:
            path = f"{folder}/{entry['name']}"
            if entry.get("type") == "directory" and depth < 2:
                folders.append((path, depth + 1))
            elif entry.get("type") == "file":
                found[path] = (entry.get("size"), entry.get("mtime"))
    return found


async def changed_outputs(
    client: SandboxClient, session_id: str, before: Snapshot
) -> list[tuple[str, bytes]]:
    """(path, bytes) of the displayable files under outputs/ that are new or changed since ``before``."""
    after = await snapshot(client, session_id)
    shown = []
    for path in sorted(after):
        if after[path] == before.get(path) or mime_type(path) is None:
            continue
        size = after[path][0] or 0
        if size > DISPLAY_MAX_BYTES:
            print(f"sandbox: {path} is {size} bytes; too large to show (use %sandbox get)", file=sys.stderr)
            continue
        with contextlib.suppress(SandboxNotFoundError):
            shown.append((path, await client.download(session_id, path)))
    return shown
