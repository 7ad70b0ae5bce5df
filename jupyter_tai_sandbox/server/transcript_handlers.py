"""``GET /api/sandbox/sessions/{id}/transcript.ipynb``: a session's commands and their output as a notebook.

Thin: the notebook is :mod:`~jupyter_tai_sandbox.transcripts`'s; the owner rule is every session route's
(another user's session answers 404 like an unknown one), and a session just destroyed or reaped whose
transcript the server still keeps (``TranscriptSettings.keep_after_end_seconds``) is still read by its owner.
"""

from __future__ import annotations

import json

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..transcripts import notebook_filename, session_notebook
from .handlers import SESSION_ID, SandboxAPIHandler

#: the notebook's media type (JupyterLab's, and IANA's registration for .ipynb)
IPYNB_TYPE = "application/x-ipynb+json"


class TranscriptHandler(SandboxAPIHandler):
    """The notebook, as an attachment named ``<session id>-transcript.ipynb``; not signed (opens untrusted)."""

    @web.authenticated
    @authorized
    async def get(self, session_id: str) -> None:
        caller = await self.caller()
        notebook = await session_notebook(
            self.sandbox_app, caller, session_id, lambda: self.get_session(session_id)
        )
        body = json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        name = notebook_filename(notebook["metadata"]["jupyter_tai_sandbox"]["session"])
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.set_header("Cache-Control", "no-store")
        self.finish(body.encode("utf-8"), set_content_type=IPYNB_TYPE)


transcript_handlers = [
    (rf"/api/sandbox/sessions/{SESSION_ID}/transcript\.ipynb", TranscriptHandler),
]
