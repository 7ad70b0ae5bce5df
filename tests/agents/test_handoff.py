"""The workspace handoff (issue 53, point 4) on a real jupyter_server: its contents manager on one side, a real
session (local, and docker for the flows where the engine's file calls matter) on the other, over REST."""

from __future__ import annotations

import json
import os
import stat

import pytest

from jupyter_tai_sandbox.client import SandboxClient
from tests.support.api_spec import check
from tests.support.server import call, exec_call, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user

pytestmark = [pytest.mark.slow(20)]

ROUTE = "/sessions/{session_id}/handoff"


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(provider, tmp_path / "sandboxes")


async def handoff(jp_fetch, sid, expect=200, headers=None, **body):
    status, answer = await call(
        jp_fetch, "sessions", sid, "handoff", method="POST", body=body, headers=headers
    )
    assert status == expect, (status, answer)
    check(ROUTE, "post", status, answer)
    return answer


async def new_session(jp_fetch, headers=None):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300}, headers=headers)
    assert status == 201, info
    return info["id"]


async def sh(jp_fetch, sid, script):
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", script])
    assert status == 200 and result["exit_code"] == 0, result
    return result["stdout"]


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


NOTEBOOK = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


async def test_copy_in_and_back_by_the_rule(jp_fetch, jp_root_dir, jp_serverapp, provider):
    for rel, text in {
        "proj/a.py": "print(1)\n",
        "proj/sub/b.txt": "b\n",
        "proj/keep.txt": "keep\n",
        "proj/both.txt": "base\n",
        "proj/.hidden": "not for the agent\n",
        "proj/nb.ipynb": NOTEBOOK,
        "elsewhere/secret.txt": "outside the handoff\n",
    }.items():
        write(jp_root_dir, rel, text)
    (jp_root_dir / "proj" / "empty").mkdir()
    sid = await new_session(jp_fetch)
    result = await handoff(jp_fetch, sid, direction="in", path="proj")
    assert sorted(result["copied"]) == [
        "proj/a.py",
        "proj/both.txt",
        "proj/keep.txt",
        "proj/nb.ipynb",
        "proj/sub/b.txt",
    ]
    assert result["bytes"] == sum(len((jp_root_dir / p).read_bytes()) for p in result["copied"])
    # the same relative path in the session; hidden files (the contents manager's rule) and the rest of the
    # contents never reach it
    assert await sh(jp_fetch, sid, "cat proj/a.py proj/sub/b.txt; test -d proj/empty && echo empty") == (
        "print(1)\nb\nempty\n"
    )
    assert await sh(jp_fetch, sid, "ls -a proj; test -e elsewhere || echo no") == (
        ".\n..\na.py\nboth.txt\nempty\nkeep.txt\nnb.ipynb\nsub\nno\n"
    )
    # the manifest is the server's: 0600, under the server's runtime dir, never in the workspace
    manifest = os.path.join(jp_serverapp.runtime_dir, "tai-sandbox-handoff", f"{sid}.json")
    assert stat.S_IMODE(os.stat(manifest).st_mode) == 0o600
    with open(manifest) as f:
        assert "proj/a.py" in json.load(f)["files"]

    # the agent's side: an edit, a new file, a deletion, an edit of a file Jupyter's side edits too
    await sh(
        jp_fetch,
        sid,
        "printf 'print(2)\\n' > proj/a.py && printf 'new\\n' > proj/sub/new.txt && rm proj/keep.txt"
        " && printf 'agent\\n' > proj/both.txt && mkdir -p proj/__pycache__ && printf x > proj/__pycache__/m.pyc"
        " && printf 's\\n' > proj/.env",
    )
    write(jp_root_dir, "proj/both.txt", "jupyter\n")
    result = await handoff(jp_fetch, sid, direction="out")
    assert sorted(result["copied"]) == ["proj/a.py", "proj/sub/new.txt"]
    assert (jp_root_dir / "proj/a.py").read_text() == "print(2)\n"
    assert (jp_root_dir / "proj/sub/new.txt").read_text() == "new\n"
    # both changed: Jupyter's copy untouched, the agent's beside it
    assert result["conflicts"] == [{"path": "proj/both.txt", "sandbox_copy": "proj/both.sandbox.txt"}]
    assert (jp_root_dir / "proj/both.txt").read_text() == "jupyter\n"
    assert (jp_root_dir / "proj/both.sandbox.txt").read_text() == "agent\n"
    # deleted in the session: kept in Jupyter, and said so
    assert (jp_root_dir / "proj/keep.txt").read_text() == "keep\n"
    skipped = {s["path"]: s["reason"] for s in result["skipped"]}
    assert "Jupyter's copy is kept" in skipped["proj/keep.txt"]
    # hidden names stay in the session, by the contents manager's rules
    assert "hide_globs" in skipped["proj/__pycache__"] and "allow_hidden" in skipped["proj/.env"]
    assert not (jp_root_dir / "proj/__pycache__").exists() and not (jp_root_dir / "proj/.env").exists()
    assert sorted(result["unchanged"]) == ["proj/nb.ipynb", "proj/sub/b.txt"]
    assert result["bytes"] == len("print(2)\n") + len("new\n") + len("agent\n")
    assert (jp_root_dir / "elsewhere/secret.txt").read_text() == "outside the handoff\n"

    # again: what came back is now the base; the conflict stands, its copy is not written twice
    again = await handoff(jp_fetch, sid, direction="out", path="proj")
    assert again["copied"] == [] and again["bytes"] == 0
    assert again["conflicts"] == result["conflicts"]
    # the user edits the sandbox copy: a later conflict never overwrites it
    write(jp_root_dir, "proj/both.sandbox.txt", "the user's notes\n")
    await sh(jp_fetch, sid, "printf 'agent 2\\n' > proj/both.txt")
    third = await handoff(jp_fetch, sid, direction="out", path="proj/both.txt")
    assert third["conflicts"] == [{"path": "proj/both.txt", "sandbox_copy": "proj/both.sandbox-2.txt"}]
    assert (jp_root_dir / "proj/both.sandbox.txt").read_text() == "the user's notes\n"
    assert (jp_root_dir / "proj/both.sandbox-2.txt").read_text() == "agent 2\n"
    # Jupyter's copy unchanged since the copy-in, the session's changed: it comes back over it
    await sh(jp_fetch, sid, "printf 'print(3)\\n' > proj/a.py")
    fourth = await handoff(jp_fetch, sid, direction="out", path="proj/a.py")
    assert fourth["copied"] == ["proj/a.py"] and (jp_root_dir / "proj/a.py").read_text() == "print(3)\n"
    await call(jp_fetch, "sessions", sid, method="DELETE")


@pytest.mark.parametrize("provider", ["local"])
async def test_the_python_client_hands_off(jp_fetch, jp_root_dir, jp_serverapp, jp_http_port, jp_base_url):
    write(jp_root_dir, "data/in.csv", "x,y\n1,2\n")
    sid = await new_session(jp_fetch)
    async with SandboxClient(
        f"http://localhost:{jp_http_port}{jp_base_url}", jp_serverapp.identity_provider.token
    ) as client:
        answer = await client.handoff(sid, "in", "data/in.csv")
        assert answer["copied"] == ["data/in.csv"] and answer["direction"] == "in"
        await client.exec(sid, ["sh", "-c", "echo 3,4 >> data/in.csv"], timeout_seconds=30)
        answer = await client.handoff(sid, "out")
        assert answer["copied"] == ["data/in.csv"]
        assert (jp_root_dir / "data/in.csv").read_text() == "x,y\n1,2\n3,4\n"
        # "" is the contents root: for a copy-back, everything handed in (here, one file, now unchanged)
        answer = await client.handoff(sid, "out", "")
        assert (answer["copied"], answer["unchanged"]) == ([], ["data/in.csv"])
        await client.destroy(sid)


async def test_nothing_leaves_the_handed_off_folder(jp_fetch, jp_root_dir, provider):
    write(jp_root_dir, "proj/a.txt", "a\n")
    write(jp_root_dir, "outside.txt", "mine\n")
    sid = await new_session(jp_fetch)
    for direction in ("in", "out"):
        for bad in ("../x", "proj/../../x", "proj/..", "..\\x"):
            body = await handoff(jp_fetch, sid, expect=400, direction=direction, path=bad)
            assert body["error"] == "SandboxPathError", body
    await handoff(jp_fetch, sid, direction="in", path="proj")
    # the agent plants links out of the folder and out of the workspace, a FIFO, and a name with a backslash
    await sh(
        jp_fetch,
        sid,
        "cd proj && ln -s /etc/passwd pw && ln -s / root && ln -s ../outside.txt up && mkdir d && "
        "ln -s ../../.. d/deep && (mkfifo fifo 2>/dev/null || true) && printf z > 'back\\slash' && "
        "printf 'outside\\n' > ../outside.txt",
    )
    result = await handoff(jp_fetch, sid, direction="out")
    skipped = {s["path"]: s["reason"] for s in result["skipped"]}
    for link in ("proj/pw", "proj/root", "proj/up", "proj/d/deep"):
        assert "symlink" in skipped[link], (link, skipped)
    if "proj/fifo" in skipped:
        assert "special file" in skipped["proj/fifo"]
    assert "separator" in skipped["proj/back\\slash"]
    assert result["copied"] == [] and result["conflicts"] == []
    on_disk = sorted(p.name for p in (jp_root_dir / "proj").iterdir())
    assert on_disk == ["a.txt"], on_disk  # no link, nothing read through one
    # a file outside the handed-off folder never comes back, even where it changed
    assert (jp_root_dir / "outside.txt").read_text() == "mine\n"
    body = await handoff(jp_fetch, sid, expect=409, direction="out", path="outside.txt")
    assert body["error"] == "SandboxConflictError" and "was not handed in" in body["message"]
    await call(jp_fetch, "sessions", sid, method="DELETE")


@pytest.mark.parametrize("provider", ["local"])
async def test_requests_refused_with_the_reason(jp_fetch, jp_root_dir):
    sid = await new_session(jp_fetch)
    body = await handoff(jp_fetch, sid, expect=409, direction="out")
    assert body["error"] == "SandboxConflictError" and "nothing was handed in" in body["message"]
    body = await handoff(jp_fetch, sid, expect=409, direction="out", path="proj")
    assert "nothing was handed in" in body["message"]
    body = await handoff(jp_fetch, sid, expect=400, direction="sideways", path="x")
    assert (body["error"], body["field"]) == ("SandboxRequestError", "direction")
    body = await handoff(jp_fetch, sid, expect=400, direction="in")
    assert body["field"] == "path"
    body = await handoff(jp_fetch, sid, expect=400, direction="in", path="x", mode="sync")
    assert body["field"] == "mode"
    body = await handoff(jp_fetch, sid, expect=404, direction="in", path="no/such/folder")
    assert body["error"] == "SandboxNotFoundError" and "Jupyter's contents" in body["message"]
    body = await handoff(jp_fetch, "sbx-0000000000000000", expect=404, direction="in", path="")
    assert body["error"] == "SandboxNotFoundError"
    await call(jp_fetch, "sessions", sid, method="DELETE")


class TestLimits:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config(
            "local",
            tmp_path / "sandboxes",
            SandboxApp={"handoff_max_bytes": 1000, "handoff_max_files": 3, "handoff_max_file_bytes": 400},
        )

    async def test_sizes_and_counts_are_bounded_with_typed_errors(self, jp_fetch, jp_root_dir):
        write(jp_root_dir, "many/1", "1")
        write(jp_root_dir, "many/2", "2")
        write(jp_root_dir, "many/3", "3")
        write(jp_root_dir, "many/4", "4")
        write(jp_root_dir, "ok/small.txt", "s")
        write(jp_root_dir, "ok/large.txt", "L" * 500)
        sid = await new_session(jp_fetch)
        body = await handoff(jp_fetch, sid, expect=413, direction="in", path="many")
        assert body["error"] == "HandoffTooLargeError" and "SandboxApp.handoff_max_files" in body["message"]
        # one file over the per-file bound is skipped, listed; the rest is copied
        result = await handoff(jp_fetch, sid, direction="in", path="ok")
        assert result["copied"] == ["ok/small.txt"]
        assert result["skipped"][0]["path"] == "ok/large.txt"
        assert "SandboxApp.handoff_max_file_bytes" in result["skipped"][0]["reason"]
        # the session makes more than the bounds allow: refused before anything is written back
        await sh(jp_fetch, sid, "for i in 1 2 3 4; do head -c 390 /dev/zero > ok/f$i; done")
        body = await handoff(jp_fetch, sid, expect=413, direction="out", path="ok")
        assert body["error"] == "HandoffTooLargeError" and "SandboxApp.handoff_max_" in body["message"]
        assert sorted(p.name for p in (jp_root_dir / "ok").iterdir()) == ["large.txt", "small.txt"]
        assert "SandboxApp.handoff_max_files" in body["message"], body
        await sh(jp_fetch, sid, "rm ok/f3 ok/f4 && head -c 390 /dev/zero > ok/small.txt")
        body = await handoff(jp_fetch, sid, expect=413, direction="out", path="ok")
        assert "SandboxApp.handoff_max_bytes" in body["message"], body
        await call(jp_fetch, "sessions", sid, method="DELETE")

    async def test_total_bytes_over_the_bound(self, jp_fetch, jp_root_dir):
        write(jp_root_dir, "big/a.txt", "x" * 390)
        write(jp_root_dir, "big/b.txt", "x" * 390)
        write(jp_root_dir, "big/d/c.txt", "x" * 390)
        sid = await new_session(jp_fetch)
        body = await handoff(jp_fetch, sid, expect=413, direction="in", path="big")
        assert "SandboxApp.handoff_max_bytes" in body["message"], body
        status, listing = await call(jp_fetch, "sessions", sid, "files", "")
        assert status == 200 and listing["entries"] == []  # refused before anything was copied
        await call(jp_fetch, "sessions", sid, method="DELETE")


class TestOwners:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config(
            "local",
            tmp_path / "sandboxes",
            ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        )

    async def test_another_users_session_answers_404(self, jp_fetch, jp_root_dir):
        write(jp_root_dir, "proj/a.txt", "a\n")
        sid = await new_session(jp_fetch, headers=as_user("alice"))
        await handoff(jp_fetch, sid, headers=as_user("alice"), direction="in", path="proj")
        for direction in ("in", "out"):
            body = await handoff(
                jp_fetch, sid, expect=404, headers=as_user("bob"), direction=direction, path="proj"
            )
            assert body["error"] == "SandboxNotFoundError"
            unknown = await handoff(
                jp_fetch,
                "sbx-0000000000000000",
                expect=404,
                headers=as_user("bob"),
                direction=direction,
                path="proj",
            )
            assert unknown["message"].replace("sbx-0000000000000000", sid) == body["message"]
        # a reader (no write on sessions) is refused by the Authorizer
        body = await handoff(
            jp_fetch, sid, expect=403, headers=as_user("reader"), direction="in", path="proj"
        )
        await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("alice"))


class NoContentsWrite(AdminOnlyAdmin):
    """As AdminOnlyAdmin; 'viewer' may use sessions but not write Jupyter's contents."""

    def is_authorized(self, handler, user, action, resource):
        if user.username == "viewer" and resource == "contents" and action == "write":
            return False
        return super().is_authorized(handler, user, action, resource)


class TestContentsAuthorization:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config(
            "local",
            tmp_path / "sandboxes",
            ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": NoContentsWrite},
        )

    async def test_copy_back_needs_write_on_the_contents(self, jp_fetch, jp_root_dir):
        write(jp_root_dir, "proj/a.txt", "a\n")
        viewer = as_user("viewer")
        sid = await new_session(jp_fetch, headers=viewer)
        await handoff(jp_fetch, sid, headers=viewer, direction="in", path="proj")
        await sh_as(jp_fetch, sid, viewer, "echo changed > proj/a.txt")
        body = await handoff(jp_fetch, sid, expect=403, headers=viewer, direction="out")
        assert body["error"] == "SandboxForbiddenError" and "contents" in body["message"]
        assert (jp_root_dir / "proj/a.txt").read_text() == "a\n"
        await call(jp_fetch, "sessions", sid, method="DELETE", headers=viewer)


async def sh_as(jp_fetch, sid, headers, script):
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", script], headers=headers)
    assert status == 200 and result["exit_code"] == 0, result


class TestContentsManagerShowingHiddenFiles:
    """A contents manager configured to show hidden files: its rules, not the default's."""

    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config(
            "local",
            tmp_path / "sandboxes",
            ContentsManager={"allow_hidden": True},
        )

    async def test_hidden_files_follow_the_contents_manager(self, jp_fetch, jp_root_dir, jp_serverapp):
        assert jp_serverapp.contents_manager.allow_hidden
        write(jp_root_dir, "proj/.config", "c\n")
        write(jp_root_dir, "proj/a.txt", "a\n")
        sid = await new_session(jp_fetch)
        result = await handoff(jp_fetch, sid, direction="in", path="proj")
        assert sorted(result["copied"]) == ["proj/.config", "proj/a.txt"]
        await sh(jp_fetch, sid, "echo c2 > proj/.config && echo x > proj/.new")
        write(jp_root_dir, "proj/a.txt", "edited in Jupyter\n")
        await sh(jp_fetch, sid, "echo edited in the session > proj/a.txt")
        result = await handoff(jp_fetch, sid, direction="out")
        assert sorted(result["copied"]) == ["proj/.config", "proj/.new"]
        assert result["conflicts"] == [{"path": "proj/a.txt", "sandbox_copy": "proj/a.sandbox.txt"}]
        assert (jp_root_dir / "proj/.config").read_text() == "c2\n"
        assert (jp_root_dir / "proj/a.sandbox.txt").read_text() == "edited in the session\n"
        await call(jp_fetch, "sessions", sid, method="DELETE")

    async def test_the_agent_home_never_comes_back(self, jp_fetch, jp_root_dir):
        write(jp_root_dir, "top.txt", "t\n")
        sid = await new_session(jp_fetch)
        await handoff(jp_fetch, sid, direction="in", path="")
        await sh(jp_fetch, sid, "mkdir .agent-home && echo k > .agent-home/key && echo n > new.txt")
        result = await handoff(jp_fetch, sid, direction="out")
        assert result["copied"] == ["new.txt"]
        assert {"path": ".agent-home", "reason": "the agent's home folder: never copied back"} in result[
            "skipped"
        ]
        assert not (jp_root_dir / ".agent-home").exists()
        await call(jp_fetch, "sessions", sid, method="DELETE")


@pytest.mark.parametrize("provider", [pytest.param("docker", marks=pytest.mark.docker)])
async def test_a_paused_session_is_refused_once(jp_fetch, jp_root_dir):
    write(jp_root_dir, "proj/a.txt", "a\n")
    sid = await new_session(jp_fetch)
    status, _ = await call(jp_fetch, "sessions", sid, "pause", method="POST")
    assert status == 200
    body = await handoff(jp_fetch, sid, expect=409, direction="in", path="proj")
    assert body["error"] == "SandboxConflictError" and "paused" in body["message"]
    await call(jp_fetch, "sessions", sid, "resume", method="POST")
    result = await handoff(jp_fetch, sid, direction="in", path="proj")
    assert result["copied"] == ["proj/a.txt"]
    await call(jp_fetch, "sessions", sid, method="DELETE")
