"""The hub's browser test asks for the browser tests' chromium and page (a screenshot at the end)."""

from tests.support.lab import browser, browser_prerequisites, page

__all__ = ["browser", "browser_prerequisites", "page"]
