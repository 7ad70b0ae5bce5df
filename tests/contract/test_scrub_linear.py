"""The transcript scrub stays linear in the output's size, however many secrets the output holds."""

from __future__ import annotations

import time

from jupyter_tai_sandbox.policy import SCRUBBED, StreamScrubber

SECRET = "s3cret-token-value"


def scrub_seconds(megabytes: int) -> float:
    line = (SECRET + "\n").encode()
    data = line * ((megabytes << 20) // len(line))
    scrubber = StreamScrubber([SECRET])
    started = time.perf_counter()
    out = scrubber.feed(data) + scrubber.flush()
    elapsed = time.perf_counter() - started
    assert out == (SCRUBBED + "\n").encode() * (len(data) // len(line))
    return elapsed


def test_a_stream_full_of_secrets_scrubs_in_linear_time():
    # eight times the data: a linear scrub takes about eight times as long, the old quadratic one 64 times
    small, large = scrub_seconds(1), scrub_seconds(8)
    assert large < 24 * max(small, 0.01), (small, large)


def test_a_secret_split_across_chunks_is_still_replaced():
    scrubber = StreamScrubber([SECRET])
    data = ("x" + SECRET + "y") * 3
    out = b"".join(scrubber.feed(data[i : i + 5].encode()) for i in range(0, len(data), 5)) + scrubber.flush()
    assert out == ("x" + SCRUBBED + "y").encode() * 3
