"""The benchmarks reference: the latest run's table, generated from benchmarks/results/latest.json at build time.

``python benchmarks/run.py`` writes ``latest.json`` (and ``bench-<stamp>.json``) into ``benchmarks/results/``,
a folder that is not committed: a checkout that has run the benchmarks shows its latest run, a clean clone
says how to get one. ``tai_benchmark_results`` (conf.py, or ``-D tai_benchmark_results=DIR``) points
elsewhere; a relative path is from the docs folder.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from tai_nodes import inline, literal_text, table


def _number(value: Any) -> str:
    if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:,.2f}"


class BenchmarksDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        folder = Path(self.env.srcdir) / self.config.tai_benchmark_results
        latest = folder / "latest.json"
        if not latest.is_file():
            text = (
                "No benchmark results in this checkout (`benchmarks/results/latest.json` is written by "
                "`python benchmarks/run.py` and is not committed): run the benchmarks, then build the docs "
                "again to see the latest table here."
            )
            return [nodes.paragraph("", "", *inline(text))]
        self.env.note_dependency(str(latest))
        data = json.loads(latest.read_text(encoding="utf-8"))
        meta = data.get("meta", {})
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(latest.stat().st_mtime))
        facts = [f"run of {when}"]
        for key, label in (
            ("seconds", "took {} s"),
            ("python", "Python {}"),
            ("machine", "{}"),
            ("cpus", "{} CPUs"),
        ):
            if meta.get(key) is not None:
                facts.append(label.format(meta[key]))
        if meta.get("quick"):
            facts.append("a quick run (--quick: fewer rounds, an eighth of the streamed bytes)")
        out: list[nodes.Node] = [
            nodes.paragraph("", "", nodes.Text("The latest results: " + ", ".join(facts) + "."))
        ]
        rows = [
            (
                [literal_text(row.get("name", ""))],
                _number(row.get("median")),
                _number(row.get("p95")),
                row.get("unit", ""),
                f"{row['ratio']:.2f}x" if isinstance(row.get("ratio"), (int, float)) else "",
                row.get("baseline") or "",
            )
            for row in data.get("rows", [])
        ]
        out.append(
            table(
                ["benchmark", "median", "p95", "unit", "ratio", "baseline"], rows, widths=[5, 2, 2, 1, 1, 4]
            )
        )
        targets = data.get("targets", [])
        if targets:
            out.append(nodes.rubric("", "Targets"))
            out.append(
                table(
                    ["result", "target", "seen"],
                    [
                        ("PASS" if t.get("passed") else "MISS", t.get("name", ""), t.get("seen", ""))
                        for t in targets
                    ],
                    widths=[1, 5, 4],
                )
            )
        notes = data.get("notes", [])
        if notes:
            out.append(nodes.rubric("", "Notes"))
            bullets = nodes.bullet_list()
            for note in notes:
                bullets += nodes.list_item("", nodes.paragraph("", "", *inline(str(note))))
            out.append(bullets)
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("tai_benchmark_results", "../benchmarks/results", "env", types=[str])
    app.add_directive("tai-benchmarks", BenchmarksDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
