import asyncio

from jupyter_tai_sandbox.spool import OutputSpool


def test_spool_keeps_order_across_memory_and_spill_file():
    async def scenario():
        spool = OutputSpool(memory_limit=10)
        records = [("stdout" if i % 3 else "stderr", bytes([i]) * (i + 1)) for i in range(50)]
        for stream, data in records[:25]:
            spool.put(stream, data)
        got = [await spool.get() for _ in range(10)]
        for stream, data in records[25:]:
            spool.put(stream, data)
        spool.close()
        assert spool._file is not None  # it did spill
        while (item := await spool.get()) is not None:
            got.append(item)
        assert got == records
        assert spool._file is None  # drained: its file is closed

    asyncio.run(scenario())


def test_spool_wakes_a_waiting_reader_and_ends_after_close():
    async def scenario():
        spool = OutputSpool()
        reader = asyncio.create_task(spool.get())
        await asyncio.sleep(0)
        spool.put("stdout", b"x")
        assert await reader == ("stdout", b"x")
        ender = asyncio.create_task(spool.get())
        await asyncio.sleep(0)
        spool.close()
        assert await ender is None

    asyncio.run(scenario())


def test_discard_drops_everything_and_refuses_more():
    async def scenario():
        spool = OutputSpool(memory_limit=1)
        spool.put("stdout", b"abc")
        spool.put("stdout", b"def")
        spool.discard()
        spool.put("stdout", b"late")
        assert await spool.get() is None

    asyncio.run(scenario())


def test_past_the_disk_limit_the_spool_stops_taking_output_and_says_so():
    async def main():
        calls = []
        spool = OutputSpool(memory_limit=10, disk_limit=100)
        spool.on_overflow = lambda: calls.append(1)
        for _ in range(30):
            spool.put("stdout", b"x" * 10)
        assert spool.overflowed and calls == [1]
        spool.close()
        kept = b""
        while (item := await spool.get()) is not None:
            kept += item[1]
        # what fits in memory plus what fits on disk (with its record headers), nothing after the overflow
        assert kept == b"x" * len(kept) and 10 < len(kept) <= 110

    asyncio.run(main())
