"""Benchmark figures in the docs, written from benchmarks/results/ (`make docs`).

A figure a doc quotes from a benchmark sits between markers that say where it comes from:

    <!-- fig:throughput:phases.-1.rounds_per_s -->23.41<!-- /fig -->

`throughput` is the results file (benchmarks/results/throughput.json), the rest a dotted path into
it (a list index may be negative; a key may hold spaces, as `ranks.multi-hop.questions missed`
does; a leading `?` marks a figure only some runs measure, such as the full run's one-user
figures, which then reads "(not in this run)"). An optional format
follows a `|`: a Python format spec (`|.1f`, `|,.0f`, `|.0%`), and before it an optional scale
(`|x1000|,.0f`: the value times 1,000). Without one, the value is written as the file holds
it. docs/MEMORY_QUALITY.md is rendered whole from locomo.json (benchmarks/_locomo_report.py).

    python benchmarks/docfigs.py [--write | --check]

`--write` rewrites every doc in place; `--check` exits 1 naming each figure that differs from its
results file (tests/bench/test_doc_figures.py runs the same comparison).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, ROOT

#: The docs whose benchmark figures are generated (README.md and docs/).
DOCS = [
    ROOT / "README.md",
    ROOT / "docs" / "ARCHITECTURE.md",
    ROOT / "docs" / "PERFORMANCE.md",
    ROOT / "docs" / "CAPACITY.md",
    ROOT / "docs" / "RELIABILITY.md",
    ROOT / "docs" / "OPERATIONS.md",
]
MEMORY_QUALITY = ROOT / "docs" / "MEMORY_QUALITY.md"

FIG = re.compile(
    r"<!-- fig:(?P<file>[A-Za-z0-9_]+):(?P<spec>[^<>]+?) -->(?P<value>.*?)<!-- /fig -->"
)


class FigureError(ValueError):
    """A marker names a results file or a path that does not exist, or a bad format."""


@cache
def _results(name: str) -> Any:
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise FigureError(f"no results file {path.relative_to(ROOT)}")
    return json.loads(path.read_text())


def lookup(data: Any, path: str) -> Any:
    """The value at a dotted path; FigureError when absent. A dict key may itself hold dots
    (the protocol's `figures` are keyed by path): the longest key that matches is taken."""
    parts = path.split(".")
    node, i = data, 0
    while i < len(parts):
        if isinstance(node, list):
            try:
                node, i = node[int(parts[i])], i + 1
            except (ValueError, IndexError):
                raise FigureError(f"no {path!r}") from None
            continue
        if not isinstance(node, dict):
            raise FigureError(f"no {path!r}")
        for j in range(len(parts), i, -1):
            key = ".".join(parts[i:j])
            if key in node:
                node, i = node[key], j
                break
        else:
            raise FigureError(f"no {path!r}")
    return node


#: What an optional figure (`?path`) reads when its results file does not hold it.
NOT_MEASURED = "(not in this run)"


def figure(name: str, spec: str, results: Any = None) -> str:
    """The text of one figure: `spec` is `[?]path[|xSCALE][|FORMAT]`; with `?` a figure that
    only some runs measure (the full run's one user, say) reads NOT_MEASURED when absent."""
    path, *fmt = spec.split("|")
    optional = path.startswith("?")
    try:
        value = lookup(_results(name) if results is None else results, path.lstrip("?"))
    except FigureError:
        if optional and (results is not None or (RESULTS / f"{name}.json").exists()):
            return NOT_MEASURED
        raise
    scale = 1.0
    if fmt and fmt[0].startswith("x"):
        try:
            scale = float(fmt.pop(0)[1:])
        except ValueError:
            raise FigureError(f"bad scale in {spec!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        if fmt or scale != 1.0:
            raise FigureError(f"{name}:{path} is not a number: {value!r}")
        return str(value)
    value = value * scale if scale != 1.0 else value
    if not fmt:
        return str(value)
    try:
        return format(value, fmt[0])
    except ValueError:
        raise FigureError(f"bad format in {spec!r}") from None


def render(text: str, where: str = "") -> str:
    """`text` with every marked figure rewritten from its results file."""

    def one(m: re.Match[str]) -> str:
        try:
            value = figure(m["file"], m["spec"])
        except FigureError as err:
            raise FigureError(f"{where}: {m.group(0)[:80]}: {err}") from None
        return f"<!-- fig:{m['file']}:{m['spec']} -->{value}<!-- /fig -->"

    return FIG.sub(one, text)


def stale(text: str, where: str = "") -> list[str]:
    """The figures of `text` that differ from their results files, one line each."""
    out = []
    for m in FIG.finditer(text):
        want = figure(m["file"], m["spec"])
        if m["value"] != want:
            out.append(f"{where}: {m['file']}:{m['spec']} reads {m['value']!r}, results {want!r}")
    return out


def memory_quality() -> str:
    """docs/MEMORY_QUALITY.md as locomo.json renders it."""
    from _locomo_report import render_report

    return render_report(_results("locomo"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite the docs in place")
    group.add_argument("--check", action="store_true", help="exit 1 when a figure is stale")
    args = parser.parse_args(argv)
    problems: list[str] = []
    for doc in DOCS:
        text = doc.read_text()
        where = str(doc.relative_to(ROOT))
        if args.write:
            new = render(text, where)
            if new != text:
                doc.write_text(new)
                print(f"rewrote figures in {where}")
        else:
            problems += stale(text, where)
    quality = memory_quality()
    if args.write:
        if MEMORY_QUALITY.read_text() != quality:
            MEMORY_QUALITY.write_text(quality)
            print("rewrote docs/MEMORY_QUALITY.md")
    elif MEMORY_QUALITY.read_text() != quality:
        problems.append("docs/MEMORY_QUALITY.md differs from locomo.json's report")
    for line in problems:
        print(line, file=sys.stderr)
    if problems and args.check:
        print("run `make docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
