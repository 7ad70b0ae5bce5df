"""A restarted server lists (and runs) the presets authored before: two real `jupyter server` processes."""

from tests.support.live_server import sandbox_server

WORD_COUNT = {
    "description": "Count the words in a text.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "binding": {"argv": ["wc", "-w"], "stdin": {"field": "text"}, "timeout_seconds": 30},
}


def test_a_restarted_server_lists_the_presets_authored_before(tmp_path):
    store = tmp_path / "data" / "presets.json"
    first = sandbox_server(tmp_path, "local", f"--SandboxApp.presets_path={store}")
    try:
        status, tool = first.call("PUT", "tools/word_count", WORD_COUNT, timeout=60)
        assert status == 201, tool
    finally:
        first.stop()
    second = sandbox_server(tmp_path, "local", f"--SandboxApp.presets_path={store}")
    try:
        status, listing = second.call("GET", "tools", timeout=60)
        assert "word_count" in [t["name"] for t in listing["tools"]]
        status, result = second.call(
            "POST", "tools/word_count/run", {"text": "survives a restart"}, timeout=60
        )
        assert (status, result["stdout"].strip()) == (200, "3")
    finally:
        second.stop()
