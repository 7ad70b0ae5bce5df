"""Scraping a test server's /metrics: the samples as {(name, labels): value}, and their differences."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, frozenset[tuple[str, str]]]
PREFIX = "jupyter_tai_sandbox_"


async def scrape(jp_fetch: Any) -> dict[Key, float]:
    """The sandbox samples of the server's /metrics (over HTTP, with the test's token)."""
    response = await jp_fetch("metrics", method="GET")
    assert response.code == 200
    samples: dict[Key, float] = {}
    for family in text_string_to_metric_families(response.body.decode()):
        for sample in family.samples:
            if sample.name.startswith(PREFIX) and not sample.name.endswith("_created"):
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def key(name: str, **labels: str) -> Key:
    return (PREFIX + name, frozenset(labels.items()))


def moved(before: dict[Key, float], after: dict[Key, float]) -> dict[Key, float]:
    """What changed between two scrapes (counters and histograms that moved, gauges that changed)."""
    changed = {}
    for k, value in after.items():
        delta = value - before.get(k, 0.0)
        if delta:
            changed[k] = delta
    return changed
