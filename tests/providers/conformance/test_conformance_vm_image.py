"""The vm provider's sessions of a docker image (commands chrooted into its files over an overlay) through the
conformance checks that a changed root could break: terminals, stops, held commands, files, an absent
program. The whole suite runs on the guest's own root (test_conformance_vm.py)."""

from __future__ import annotations

import pytest

from jupyter_tai_sandbox.conformance import check_names
from jupyter_tai_sandbox.testing import SandboxConformance
from tests.support.docker import TEST_IMAGE, docker_client
from tests.support.vm import NothingLeftOfTheCheck, need_qemu, vm_sandbox

pytestmark = [pytest.mark.docker, pytest.mark.slow(90)]

#: the checks this class runs (the rest: a root is no part of them)
ROOTED_CHECKS = {
    "lifecycle",
    "streams_and_status",
    "interactive_seam",
    "kill_past_deadline",
    "group_stopped_after_exit",
    "file_transfer",
    "workspace_paths",
    "pty_window_and_resize",
    "pty_ctrl_c",
    "commands_start_with_default_signals",
    "pty_stop_ends_the_terminal_session",
    "setsid_command_is_stopped",
    "absent_program_is_a_typed_error",
    "held_commands_are_listed_and_resumed_exactly",
    "fork_copies_the_session_or_is_refused",
}


@pytest.fixture(scope="module", autouse=True)
def qemu_and_image():
    need_qemu()
    docker_client().close()  # the image's files come from the engine


class TestVmImageConformance(NothingLeftOfTheCheck, SandboxConformance):
    image = TEST_IMAGE

    def make_sandbox(self, tmp_path):
        sandbox = vm_sandbox(tmp_path)
        sandbox.images = [TEST_IMAGE]
        return sandbox


for _name in check_names():
    if _name not in ROOTED_CHECKS:
        setattr(TestVmImageConformance, f"test_{_name}", None)
