"""The internal link check of the built docs site (``python3 docs/_ext/tai_links.py docs/_build/html``).

Every internal link (``a``/``link``/``area`` href, ``img``/``script`` src) of every page resolves: its file
exists inside the site and its ``#fragment`` is an id on that page. External links are listed, not fetched
(no network here). Exits 1 when a link is broken. .ci/docs runs it after the build; tests/docs use it too.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            elif (name == "href" and tag in ("a", "link", "area")) or (
                name == "src" and tag in ("img", "script")
            ):
                self.links.append(value)


def check(root: Path) -> tuple[int, list[str], set[str], int]:
    """(links checked, broken ones, external ones, pages) for a built site."""
    root = root.resolve()
    pages: dict[Path, Page] = {}
    for path in sorted(root.rglob("*.html")):
        if path.relative_to(root).parts[0] in ("_static", "_sources"):  # the theme's templates, not pages
            continue
        page = Page()
        page.feed(path.read_text(encoding="utf-8", errors="replace"))
        pages[path] = page

    broken: list[str] = []
    external: set[str] = set()
    checked = 0
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme in ("http", "https") or link.startswith("//"):
                external.add(link)
                continue
            if parts.scheme:  # mailto:, javascript:, data:
                continue
            checked += 1
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            where = f"{path.relative_to(root)}: {link}"
            if not target.is_relative_to(root) or not target.exists():
                broken.append(f"{where} (no file {target})")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target in pages and fragment not in pages[target].ids:
                broken.append(f"{where} (no id {fragment!r} on {target.relative_to(root)})")
    return checked, broken, external, len(pages)


def main(argv: list[str]) -> int:
    checked, broken, external, pages = check(Path(argv[1] if len(argv) > 1 else "docs/_build/html"))
    print(f"internal links: {checked} checked in {pages} pages, {len(broken)} broken")
    print(f"external links (listed, not fetched: no network here): {len(external)}")
    for link in sorted(external):
        print(f"  {link}")
    for line in broken:
        print(f"BROKEN {line}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
