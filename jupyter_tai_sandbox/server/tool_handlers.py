"""REST doors of the code tools (thin: parse, resolve the principal, call the chokepoint).

The fence is not checked here: :class:`~jupyter_tai_sandbox.tools.ToolRegistry`
checks it at its authoring and tool-run chokepoints, for every door. These
handlers only ask jupyter_server's Authorizer, once per request, which admin
actions the user holds on ``jupyter_tai_sandbox:admin``.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..tools import Decided, Principal
from .handlers import SandboxAPIHandler

TOOL_NAME = r"(?P<name>[^/]+)"


class ToolsAPIHandler(SandboxAPIHandler):
    async def principal(self) -> Principal:
        """The caller at the tool chokepoints: its admin actions decide the fence, its name owns the sessions."""
        caller = await self.caller()
        return Decided(
            name=f"user {caller.name!r}", door="rest", allowed=caller.admin_actions, owner=caller.name
        )


class ToolsHandler(ToolsAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.write_json({"tools": self.tools.list_json(await self.principal())})


class ToolHandler(ToolsAPIHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        self.write_json(self.tools.get(name, await self.principal()).to_json())

    @web.authenticated
    @authorized
    async def put(self, name: str) -> None:
        replace = self.get_argument("replace", "0").lower() in ("1", "true", "yes")
        principal = await self.principal()
        existed = name in self.tools.presets(principal)
        preset = self.tools.author(self.read_json(), principal=principal, name=name, replace=replace)
        self.write_json(preset.to_json(), status=200 if existed else 201)

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        self.tools.remove(name, principal=await self.principal())
        self.set_status(204)
        self.finish()


class ToolRunHandler(ToolsAPIHandler):
    @web.authenticated
    @authorized(action="execute")
    async def post(self, name: str) -> None:
        inputs: Any = self.read_json()
        self.touch()
        self.write_json(await self.tools.run(name, inputs, principal=await self.principal()))
        self.touch()


tool_handlers = [
    (r"/api/sandbox/tools", ToolsHandler),
    (rf"/api/sandbox/tools/{TOOL_NAME}", ToolHandler),
    (rf"/api/sandbox/tools/{TOOL_NAME}/run", ToolRunHandler),
]
