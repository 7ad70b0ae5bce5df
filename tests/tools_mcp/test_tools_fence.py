"""The fenced admin tier with a denying Authorizer: sessions stay usable, code tools do not.

The REST doors ask jupyter_server's Authorizer (resource jupyter_tai_sandbox:admin);
the config and CLI doors act as the operator, so they pass -- and the REST run door
stays shut for what they authored.
"""

import json

import pytest
from jupyter_server.auth.authorizer import Authorizer

from jupyter_tai_sandbox import cli
from jupyter_tai_sandbox.tools import ADMIN_RESOURCE
from tests.support.server import call, exec_call, server_config

WORD_COUNT = {
    "description": "Count the words in a text.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "binding": {"argv": ["wc", "-w"], "stdin": {"field": "text"}, "timeout_seconds": 30},
}


class NoAdmin(Authorizer):
    """Lets a user do everything with sessions, nothing on the admin resource."""

    def is_authorized(self, handler, user, action, resource):
        return resource != ADMIN_RESOURCE


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "data" / "presets.json"


@pytest.fixture
def jp_server_config(tmp_path, store_path):
    return server_config(
        "local",
        tmp_path / "sandboxes",
        ServerApp={"authorizer_class": NoAdmin},
        SandboxApp={"presets_path": str(store_path), "presets": {"from_config": WORD_COUNT}},
    )


async def test_rest_authoring_and_running_are_refused_but_sessions_work(jp_fetch, store_path):
    status, body = await call(jp_fetch, "tools", "word_count", method="PUT", body=WORD_COUNT)
    assert (status, body["error"]) == (403, "ToolAccessDeniedError") and ADMIN_RESOURCE in body["message"]
    # fenced before validation: a broken definition gets the same 403
    assert (await call(jp_fetch, "tools", "x", method="PUT", body={"base": "nope"}))[0] == 403
    assert not store_path.exists()
    for name, inputs in (("from_config", {"text": "a"}), ("sandbox_exec", {"argv": ["true"]})):
        status, body = await call(jp_fetch, "tools", name, "run", method="POST", body=inputs)
        assert (status, body["error"]) == (403, "ToolAccessDeniedError"), body
    assert (await call(jp_fetch, "tools", "from_config", method="DELETE"))[0] == 403
    # the open tier and ordinary sandbox use are not fenced
    assert (await call(jp_fetch, "tools", "sandbox_status", "run", method="POST", body={}))[0] == 200
    assert (await call(jp_fetch, "tools"))[0] == 200
    status, info = await call(jp_fetch, "sessions", method="POST", body={})
    assert status == 201
    status, result = await exec_call(jp_fetch, info["id"], ["echo", "ok"], 10)
    assert (status, result["stdout"]) == (200, "ok\n")


async def test_the_config_door_acts_as_the_operator(jp_fetch):
    status, tool = await call(jp_fetch, "tools", "from_config")
    assert (status, tool["source"], tool["fenced"]) == (200, "config", True)


async def test_the_cli_door_acts_as_the_operator_and_the_run_stays_fenced(jp_fetch, store_path, tmp_path):
    path = tmp_path / "wc.json"
    path.write_text(json.dumps(WORD_COUNT))
    assert cli.main(["preset", "--store", str(store_path), "add", str(path), "--name", "word_count"]) == 0
    status, tool = await call(jp_fetch, "tools", "word_count")
    assert (status, tool["source"]) == (200, "store")
    status, _body = await call(jp_fetch, "tools", "word_count", "run", method="POST", body={"text": "a"})
    assert status == 403
    assert (await call(jp_fetch, "tools", "word_count", method="DELETE"))[0] == 403
    assert cli.main(["preset", "--store", str(store_path), "rm", "word_count"]) == 0


@pytest.mark.parametrize(
    ("method", "parts", "body"),
    [
        ("GET", ("tools",), None),
        ("GET", ("tools", "sandbox_exec"), None),
        ("PUT", ("tools", "x"), WORD_COUNT),
        ("DELETE", ("tools", "x"), None),
        ("POST", ("tools", "sandbox_status", "run"), {}),
    ],
)
async def test_every_tools_route_refuses_an_unauthenticated_request(jp_fetch, method, parts, body):
    status, reply = await call(jp_fetch, *parts, method=method, body=body, headers={"Authorization": ""})
    assert status == 403, reply
