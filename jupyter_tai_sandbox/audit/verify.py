"""``audit verify``: check the hash chain of an audit log and its rotated files, and name every line that
breaks it.

Each line carries ``seq`` (consecutive across the files) and ``prev`` (the sha256 of the line before). Read
together they tell what happened to a line:

* **edited**: the line with the next seq records a ``prev`` that is not this line's hash (or the line is no
  longer a valid audit line);
* **removed**: seqs are missing between two lines (named with where they were);
* **reordered**: a line whose seq is out of place in the file order (named with where it belongs);
* **inserted**: a second line with a seq another line holds, the one the chain does not go through.

A **torn** line (a server killed mid-write: an invalid line the next line chains past, or a last line with
no newline) is reported as a note, not as tampering. What a hash chain cannot show: lines cut from the end,
and a chain rewritten whole from some line on (keep the head verify prints somewhere else to catch those).
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .log import GENESIS, line_hash, log_files

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Line:
    file: str
    number: int
    raw: bytes
    ended: bool  # a newline follows it
    record: dict[str, Any] | None = None
    invalid: str = ""

    @property
    def seq(self) -> int:
        assert self.record is not None
        return int(self.record["seq"])

    @property
    def where(self) -> str:
        return f"{self.file}:{self.number}"


@dataclass
class Finding:
    file: str
    line: int
    what: str  # edited, removed, reordered, inserted, torn, note
    message: str
    tampering: bool = True

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}: {self.message}"


@dataclass
class Report:
    files: list[str]
    lines: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    head: str | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not any(f.tampering for f in self.findings)


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        record = json.loads(raw)
    except ValueError:
        return None, "not JSON"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    seq = record.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return None, "no valid seq"
    prev = record.get("prev")
    if not isinstance(prev, str) or not _HEX64.match(prev):
        return None, "no valid prev"
    if not isinstance(record.get("kind"), str):
        return None, "no kind"
    return record, ""


def read_lines(path: str) -> tuple[list[str], list[Line]]:
    files = log_files(path)
    lines: list[Line] = []
    for name in files:
        with open(name, "rb") as f:
            data = f.read()
        parts = data.split(b"\n")
        ended_last = data.endswith(b"\n")
        if ended_last:
            parts = parts[:-1]
        for index, raw in enumerate(parts):
            ended = index < len(parts) - 1 or ended_last
            line = Line(name, index + 1, raw, ended)
            line.record, line.invalid = _parse(raw) if raw else (None, "an empty line")
            lines.append(line)
    return files, lines


def _increasing(seqs: list[int]) -> set[int]:
    """Indexes of a longest strictly increasing subsequence of ``seqs``."""
    tails: list[int] = []  # seq ending the best run of each length
    tail_index: list[int] = []
    before = [-1] * len(seqs)
    for i, seq in enumerate(seqs):
        at = bisect.bisect_left(tails, seq)
        if at == len(tails):
            tails.append(seq)
            tail_index.append(i)
        else:
            tails[at] = seq
            tail_index[at] = i
        before[i] = tail_index[at - 1] if at > 0 else -1
    keep: set[int] = set()
    i = tail_index[-1] if tail_index else -1
    while i >= 0:
        keep.add(i)
        i = before[i]
    return keep


def verify(path: str) -> Report:
    """Check the log at ``path`` (and PATH.1, PATH.2...): every finding, in file order."""
    files, lines = read_lines(path)
    report = Report(files=files, lines=len(lines))
    findings = report.findings
    valid = [line for line in lines if line.record is not None]
    hashes = {id(line): line_hash(line.raw) for line in valid}

    # duplicates: the line the chain goes through keeps its seq, the others are inserted
    by_seq_all: dict[int, list[Line]] = defaultdict(list)
    for line in valid:
        by_seq_all[line.seq].append(line)
    inserted: set[int] = set()
    for seq, same in by_seq_all.items():
        if len(same) < 2:
            continue
        wanted = {nxt.record["prev"] for nxt in by_seq_all.get(seq + 1, []) if nxt.record}
        before = {hashes[id(p)] for p in by_seq_all.get(seq - 1, [])} | ({GENESIS} if seq == 1 else set())
        chained = next((c for c in same if hashes[id(c)] in wanted), None)
        chained = chained or next((c for c in same if c.record and c.record["prev"] in before), same[0])
        for other in same:
            if other is chained:
                continue
            inserted.add(id(other))
            copy = " (a copy of it)" if other.raw == chained.raw else ""
            findings.append(
                Finding(
                    other.file,
                    other.number,
                    "inserted",
                    f"a second line with seq {seq}{copy}: the chain goes through {chained.where}",
                )
            )
    chain = [line for line in valid if id(line) not in inserted]
    by_seq = {line.seq: line for line in chain}

    # reordered: off the longest run of increasing seqs in file order
    order = _increasing([line.seq for line in chain])
    for index, line in enumerate(chain):
        if index in order:
            continue
        seq = line.seq
        if seq - 1 in by_seq:
            where = f"after seq {seq - 1} ({by_seq[seq - 1].where})"
        elif seq + 1 in by_seq:
            where = f"before seq {seq + 1} ({by_seq[seq + 1].where})"
        else:
            where = "elsewhere"
        findings.append(
            Finding(line.file, line.number, "reordered", f"seq {seq} is out of place: it belongs {where}")
        )

    # invalid lines: torn (the chain goes on past them) or edited
    position = {id(line): i for i, line in enumerate(lines)}
    explained: set[tuple[int, int]] = set()  # (seq before, seq after) spans an edited line accounts for
    for i, line in enumerate(lines):
        if line.record is not None:
            continue
        before_line = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].record is not None), None)
        after_line = next((lines[j] for j in range(i + 1, len(lines)) if lines[j].record is not None), None)
        if after_line is None and not line.ended:
            findings.append(
                Finding(
                    line.file,
                    line.number,
                    "torn",
                    "the last line is cut short (the server stopped mid-write)",
                    False,
                )
            )
            continue
        if (
            before_line is not None
            and after_line is not None
            and after_line.seq == before_line.seq + 1
            and after_line.record is not None
            and after_line.record["prev"] == hashes[id(before_line)]
        ):
            findings.append(
                Finding(
                    line.file,
                    line.number,
                    "torn",
                    "a line cut short (a server stopped mid-write); the next line chains past it",
                    False,
                )
            )
            continue
        findings.append(Finding(line.file, line.number, "edited", f"not a valid audit line ({line.invalid})"))
        if before_line is not None and after_line is not None:
            explained.add((before_line.seq, after_line.seq))

    # removed: seqs missing
    seqs = sorted(by_seq)
    for low, high in itertools.pairwise(seqs):
        if high == low + 1:
            continue
        missing = high - low - 1
        edited_between = (low, high) in explained and missing == sum(
            1
            for line in lines[position[id(by_seq[low])] + 1 : position[id(by_seq[high])]]
            if line.record is None
        )
        if edited_between:
            continue
        span = f"seq {low + 1}" if missing == 1 else f"seq {low + 1} to {high - 1}"
        at = by_seq[high]
        findings.append(
            Finding(
                at.file,
                at.number,
                "removed",
                f"{span} ({missing} line{'s' if missing > 1 else ''}) missing before this line (after {by_seq[low].where})",
            )
        )

    # the chain: each line's prev is the hash of the line with the seq before
    for seq in seqs:
        line = by_seq[seq]
        assert line.record is not None
        prev = line.record["prev"]
        if seq - 1 in by_seq:
            before_line = by_seq[seq - 1]
            if prev != hashes[id(before_line)]:
                findings.append(
                    Finding(
                        before_line.file,
                        before_line.number,
                        "edited",
                        f"its hash is not the prev that seq {seq} ({line.where}) records",
                    )
                )
        elif seq == 1 and prev != GENESIS:
            findings.append(
                Finding(line.file, line.number, "edited", "the first line's prev is not 64 zeros")
            )
    if seqs and seqs[0] > 1:
        first = by_seq[seqs[0]]
        findings.append(
            Finding(
                first.file,
                first.number,
                "note",
                f"the kept lines start at seq {seqs[0]}: the older ones were rotated out (AuditSettings.backups)",
                False,
            )
        )
    if seqs:
        report.first_seq, report.last_seq = seqs[0], seqs[-1]
        report.head = hashes[id(by_seq[seqs[-1]])]
    rank = {name: i for i, name in enumerate(files)}
    findings.sort(key=lambda f: (rank.get(f.file, 0), f.line))
    return report


def summary(report: Report, path: str) -> str:
    """One line: what was checked, and the result."""
    where = f"{report.lines} line(s) in {len(report.files)} file(s)"
    if not report.files:
        return f"{path}: no audit log there"
    seqs = f", seq {report.first_seq} to {report.last_seq}, head {report.head}" if report.head else ""
    problems = sum(1 for f in report.findings if f.tampering)
    verdict = "intact" if not problems else f"{problems} problem(s)"
    return f"{os.path.abspath(path)}: {where}{seqs}: {verdict}"
