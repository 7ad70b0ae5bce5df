"""Files sandboxed code writes under outputs/ never become active content in the user's page.

Unit tests of ``inert_display`` (what the page would receive), then a live kernel
and server: a cell writes hostile HTML, SVG and Markdown, the cell's display data
is inert, ``--trusted-outputs`` restores active content, and a session without
outputs/ leaves no 404 in the server's log.
"""

from __future__ import annotations

import base64
import html
import re
from html.parser import HTMLParser

import pytest

from jupyter_tai_sandbox.magics.outputs import FRAME_CSP, inert_display
from tests.support.live_server import local_server, magics_kernel

HOSTILE_HTML = (
    '<html><head><script>parent.pwned = 1; fetch("/api/terminals", {method: "POST"})</script></head>'
    '<body onload="parent.pwned = 2"><img src=x onerror="parent.pwned = 3">'
    '<a href="javascript:parent.pwned=4">x</a>"quoted" &amp; \'single\' </iframe><script>alert(1)</script>'
    '<iframe srcdoc="<script>parent.pwned=5</script>"></iframe><table><tr><td>1</td></tr></table></body></html>'
)
HOSTILE_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" onload="parent.pwned = 6" width="4" height="4">'
    '<script>parent.pwned = 7</script><rect width="4" height="4"/></svg>'
)
HOSTILE_MD = '# Title\n\n<script>parent.pwned = 8</script>\n\n<img src=x onerror="parent.pwned = 9">\n'


class Tags(HTMLParser):
    """Every start tag of a fragment, with its attributes (entities decoded, as a browser would)."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag


def assert_inert_frame(fragment: str, document: str) -> None:
    """``fragment`` is exactly a div holding one sandboxed iframe whose srcdoc is ``document`` after the CSP."""
    assert "<script" not in fragment.lower()
    tags = Tags(fragment).tags
    assert [t for t, _ in tags] == ["div", "iframe"], tags
    attrs = tags[1][1]
    assert set(attrs) == {"sandbox", "referrerpolicy", "title", "style", "srcdoc"}, attrs
    assert attrs["sandbox"] == ""  # no allow-scripts, no allow-same-origin, no allow-anything
    assert "allow" not in fragment.split("srcdoc=")[0]
    assert not any(name.startswith("on") for _, a in tags for name in a)
    csp = f'<meta http-equiv="Content-Security-Policy" content="{FRAME_CSP}">'
    assert attrs["srcdoc"] == csp + document  # escaped once, unescaped once by the browser
    assert "default-src 'none'" in FRAME_CSP and "script-src" not in FRAME_CSP


def test_html_goes_into_a_sandboxed_iframe_with_everything_escaped():
    bundle = inert_display("outputs/report.html", HOSTILE_HTML.encode())
    assert set(bundle) == {"text/html", "text/plain"}
    assert_inert_frame(bundle["text/html"], HOSTILE_HTML)
    assert bundle["text/plain"] == "<sandbox outputs/report.html>"


def test_a_hostile_file_name_cannot_break_out_of_the_title():
    name = 'outputs/"><script>alert(1)</script>.html'
    bundle = inert_display(name, b"<p>hi</p>")
    assert_inert_frame(bundle["text/html"], "<p>hi</p>")
    assert Tags(bundle["text/html"]).tags[1][1]["title"] == name


def test_svg_is_an_img_of_a_data_url():
    bundle = inert_display("outputs/chart.svg", HOSTILE_SVG.encode())
    assert set(bundle) == {"text/html", "text/plain"}  # no image/svg+xml: a frontend may inline that
    fragment = bundle["text/html"]
    assert "<script" not in fragment.lower() and "onload" not in fragment
    [(tag, attrs)] = Tags(fragment).tags
    assert tag == "img" and set(attrs) == {"src", "alt"} and attrs["alt"] == "outputs/chart.svg"
    prefix = "data:image/svg+xml;base64,"
    assert attrs["src"].startswith(prefix)
    assert base64.b64decode(attrs["src"][len(prefix) :]).decode() == HOSTILE_SVG


def test_markdown_is_plain_text():
    assert inert_display("outputs/notes.md", HOSTILE_MD.encode()) == {"text/plain": HOSTILE_MD}
    assert inert_display("outputs/NOTES.MARKDOWN", b"# x") == {"text/plain": "# x"}


def test_images_and_json_are_unchanged():
    assert inert_display("outputs/a.png", b"\x89PNG")["image/png"] == base64.b64encode(b"\x89PNG").decode()
    assert inert_display("outputs/a.json", b'{"k": [1]}') == {
        "application/json": {"k": [1]},
        "text/plain": "<sandbox outputs/a.json>",
    }
    with pytest.raises(ValueError):
        inert_display("outputs/bad.json", b"{nope")
    with pytest.raises(ValueError):
        inert_display("outputs/a.txt", b"text")


def test_trusted_outputs_restore_active_content():
    assert inert_display("o/a.html", b"<script>x</script>", trusted=True)["text/html"] == "<script>x</script>"
    assert inert_display("o/a.svg", HOSTILE_SVG.encode(), trusted=True)["image/svg+xml"] == HOSTILE_SVG
    assert inert_display("o/a.md", b"# x", trusted=True)["text/markdown"] == "# x"


def test_invalid_utf8_and_huge_documents_still_escape():
    data = b"<script>\xff\xfe</script>" * 1000
    fragment = inert_display("outputs/x.htm", data)["text/html"]
    assert "<script" not in fragment.lower()
    assert re.search(r"height: (\d+)px", fragment).group(1) == "120"  # one line: the smallest frame


# ---------------------------------------------------------------- in a live kernel


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from local_server(tmp_path_factory, "outputs-server")


@pytest.fixture(scope="module")
def kernel(server):
    yield from magics_kernel(server)


def write_files(**files: str) -> str:
    """A %%sandbox python3 body writing ``files`` (name -> text) under outputs/."""
    lines = ["import os", "os.makedirs('outputs', exist_ok=True)"]
    lines += [f"open('outputs/{name}', 'w').write({text!r})" for name, text in files.items()]
    return "\n".join(lines)


def test_hostile_outputs_reach_the_cell_inert(kernel):
    body = write_files(**{"page.html": HOSTILE_HTML, "chart.svg": HOSTILE_SVG, "notes.md": HOSTILE_MD})
    run = kernel.ok("%%sandbox python3 --session hostile\n" + body)
    shown = {d["metadata"]["sandbox_path"]: d for d in run.displays}
    assert set(shown) == {"outputs/page.html", "outputs/chart.svg", "outputs/notes.md"}
    for display in shown.values():
        assert display["metadata"]["sandbox_inert"] is True
        for mime, value in display["data"].items():
            if mime == "text/html":
                assert "<script" not in value.lower(), value
                assert not any(n.startswith("on") for _, a in Tags(value).tags for n in a), value
        assert "text/markdown" not in display["data"] and "image/svg+xml" not in display["data"]
    assert_inert_frame(shown["outputs/page.html"]["data"]["text/html"], HOSTILE_HTML)
    assert shown["outputs/notes.md"]["data"] == {"text/plain": HOSTILE_MD}


def test_trusted_outputs_flag_publishes_active_content(kernel):
    body = write_files(**{"page.html": "<b>trusted</b>", "chart.svg": HOSTILE_SVG, "notes.md": "# t"})
    run = kernel.ok("%%sandbox python3 --session trusted --trusted-outputs\n" + body)
    shown = {d["metadata"]["sandbox_path"]: d["data"] for d in run.displays}
    assert shown["outputs/page.html"]["text/html"] == "<b>trusted</b>"
    assert shown["outputs/chart.svg"]["image/svg+xml"] == HOSTILE_SVG
    assert shown["outputs/notes.md"]["text/markdown"] == "# t"
    assert all("sandbox_inert" not in d["metadata"] for d in run.displays)
    # the flag is per cell: the next cell in the same session is inert again
    run = kernel.ok("%%sandbox --session trusted\nsleep 1; echo '<b>again</b>' > outputs/page.html")
    [display] = run.displays
    assert_inert_frame(display["data"]["text/html"], "<b>again</b>\n")


def test_a_session_without_outputs_logs_no_404(kernel, server):
    mark = len(server.log_path.read_bytes())
    run = kernel.ok("%%sandbox --session no-outputs\necho plain")
    assert run.stdout == "plain\n" and run.displays == []
    kernel.ok("%%sandbox --session no-outputs\necho again")
    log = server.log_path.read_bytes()[mark:].decode(errors="replace")
    assert not re.search(r"\b404\b", log), log
    assert not re.search(r"^\[W ", log, re.M), log
    # and outputs/ made later is still found
    run = kernel.ok("%%sandbox --session no-outputs\nmkdir outputs; echo '{\"a\": 1}' > outputs/x.json")
    assert [d["data"]["application/json"] for d in run.displays] == [{"a": 1}]


def test_escaping_round_trips_through_html_unescape():
    fragment = inert_display("outputs/q.html", b'a "b" &amp; <c>')["text/html"]
    srcdoc = fragment.split('srcdoc="', 1)[1].rsplit('"></iframe>', 1)[0]
    assert '"' not in srcdoc and "<" not in srcdoc
    assert html.unescape(srcdoc).endswith('a "b" &amp; <c>')
