"""One set of limits for a command and a listing (issue 50, finding 4): a START carrying the contract's 1 MiB
of argv and env, however JSON escapes it, runs and harms no command beside it; a folder too large for one
reply frame is listed in pages."""

from __future__ import annotations

import pytest

from jupyter_tai_sandbox.agent.client import MAX_LIST_ENTRIES
from tests.support.agent import run

pytestmark = [pytest.mark.timeout(240), pytest.mark.docker]

#: Linux's longest single argument (MAX_ARG_STRLEN - 1) of a byte JSON escapes as \\u0001 (6 bytes)
ESCAPED_ARG = "\x01" * ((128 << 10) - 1)


def test_a_start_of_a_megabyte_of_escaped_argv_runs_and_the_command_beside_it_lives_on(session):
    async def go():
        client = await session.client()
        try:
            neighbour = await client.start(["sh", "-c", "read line; echo got $line"])
            big = await client.start(
                ["sh", "-c", 'for a; do printf %s "$a"; done | wc -c', "sh", *[ESCAPED_ARG] * 7]
            )
            out, err, status = await big.collect()
            assert status.code == 0, err
            assert int(out) == 7 * len(ESCAPED_ARG)
            await neighbour.write(b"it\n")
            await neighbour.close_stdin()
            out, _, status = await neighbour.collect()
            assert (out, status.code) == (b"got it\n", 0)
        finally:
            await client.close()

    run(go())


def test_a_folder_past_one_reply_frame_is_listed_whole_in_pages(session):
    session.exec(
        "sh",
        "-c",
        # 6,000 entries of 200-character names: about 1.7 MB of listing, past one 1 MiB frame
        "mkdir -p /data/many && cd /data/many && p=$(printf '%0190d' 0) && i=0; "
        'while [ $i -lt 6000 ]; do : > "$p-$i"; i=$((i+1)); done',
    )

    async def go():
        client = await session.client()
        try:
            names = [e["name"] for e in await client.listdir("/data", "many")]
            assert len(names) == len(set(names)) == 6000 < MAX_LIST_ENTRIES and names == sorted(names)
            await client.ping()  # the connection is whole
        finally:
            await client.close()

    run(go())
