"""The browser tests' fixtures: a ``jupyter lab`` per test (``lab_process``), chromium and a fresh page."""

from tests.support.lab import browser, browser_prerequisites, lab_process, page

__all__ = ["browser", "browser_prerequisites", "lab_process", "page"]
