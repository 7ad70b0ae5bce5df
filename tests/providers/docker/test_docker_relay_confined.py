"""The exec relay (``agent connect``) is out of session code's reach from its first instruction (issue 50,
finding 1): root session code once killed a relay and, before the new one's PR_SET_DUMPABLE, opened its
/proc/<pid>/fd/0 and /fd/1 and answered the server as the agent. The relay now runs as RELAY_USER, which may
execute the agent binary but not read it, so the kernel makes it non-dumpable at its exec: session code, root
without CAP_SYS_PTRACE, cannot open its descriptors, not even after becoming RELAY_USER."""

from __future__ import annotations

import asyncio
import json

import pytest

from jupyter_tai_sandbox.agent.client import AGENT_PATH, RELAY_USER
from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.providers.docker import DockerSandbox
from tests.support import docker

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

#: run by root session code: every relay it can see, who it runs as, and what session code may open of it
PROBE = r"""
import json, os, sys
agent, uid = sys.argv[1], int(sys.argv[2])


def opens(pid):
    # whether this process can take the relay's stdin or stdout (what the hijack did), or see where they go
    for fd in ("0", "1"):
        try:
            os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK))
            return True
        except PermissionError:
            pass
        try:
            os.readlink(f"/proc/{pid}/fd/{fd}")
            return True
        except PermissionError:
            pass
    return False

seen = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if int(stat.rsplit(")", 1)[1].split()[1]) != 0 or pid == "1" or cmdline[-2:-1] != [b"connect"]:
        continue
    status = open(f"/proc/{pid}/status").read()
    relay = {"uid": int(status.split("Uid:")[1].split()[0]), "root_opens_its_stdio": opens(pid)}
    seen.append(relay)
try:  # a session's root may lack CAP_SETUID (the provider's hardening): then it cannot even try
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
except PermissionError:
    print(json.dumps({"relays": seen, "binary_readable_by_relay_user": False, "fds_read_as_relay_user": []}))
    sys.exit(0)
try:
    open(agent, "rb").read(1)
    readable = True
except PermissionError:
    readable = False
as_relay_user = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[-2:-1] == [b"connect"] and opens(pid):
            as_relay_user.append(pid)
    except FileNotFoundError:
        pass
print(json.dumps({"relays": seen, "binary_readable_by_relay_user": readable, "fds_read_as_relay_user": as_relay_user}))
"""


def test_the_exec_relay_runs_as_its_own_user_non_dumpable_from_exec(client):
    async def main():
        sandbox = DockerSandbox(image=PYTHON_IMAGE, extra_labels=docker.RUN_LABEL, agent_transport="exec")
        session = await sandbox.create(SessionSpec(image=PYTHON_IMAGE, consumer="relay-confined"))
        try:
            uid = int(RELAY_USER.split(":")[0])
            result = await session.exec(["python3", "-c", PROBE, AGENT_PATH, str(uid)], timeout_seconds=60)
            assert result.exit_code == 0, result.stderr
            found = json.loads(result.stdout)
            assert found["relays"], found  # this very exec came through a relay
            for relay in found["relays"]:
                assert relay == {"uid": uid, "root_opens_its_stdio": False}, found
            assert not found["binary_readable_by_relay_user"] and found["fds_read_as_relay_user"] == [], found
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())
