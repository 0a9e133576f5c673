"""Every benchmark figure the docs quote is the one its results file holds (`make docs` writes
them, benchmarks/docfigs.py); no servers, no benchmark run: the committed files are compared."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import docfigs


@pytest.mark.parametrize("doc", docfigs.DOCS, ids=lambda p: p.name)
def test_doc_figures_match_their_results(doc: Path) -> None:
    assert docfigs.stale(doc.read_text(), doc.name) == [], "run `make docs`"


def test_memory_quality_is_the_locomo_report() -> None:
    assert docfigs.MEMORY_QUALITY.read_text() == docfigs.memory_quality(), "run `make docs`"


@pytest.mark.parametrize("doc", ["README.md", "PERFORMANCE.md", "CAPACITY.md"])
def test_the_docs_that_quote_benchmarks_have_generated_figures(doc: Path) -> None:
    """A doc that quotes benchmarks keeps its figures under markers (none removed wholesale)."""
    path = next(p for p in docfigs.DOCS if p.name == doc)
    assert len(docfigs.FIG.findall(path.read_text())) >= 3


def test_a_figure_that_differs_from_its_file_is_named_and_rewritten(tmp_path: Path) -> None:
    results = json.loads((docfigs.RESULTS / "throughput.json").read_text())
    real = results["phases"][-1]["rounds_per_s"]
    wrong = real + 1.5
    text = (
        "rate <!-- fig:throughput:phases.-1.rounds_per_s -->"
        f"{wrong}<!-- /fig --> and cpu <!-- fig:throughput:phases.-1.cpu_ms_per_round_all|.0f -->"
        "x<!-- /fig -->"
    )
    problems = docfigs.stale(text, "doc")
    assert len(problems) == 2
    assert str(wrong) in problems[0] and str(real) in problems[0]
    fixed = docfigs.render(text, "doc")
    assert f"-->{real}<!-- /fig -->" in fixed
    cpu = results["phases"][-1]["cpu_ms_per_round_all"]
    assert f"-->{cpu:.0f}<!-- /fig -->" in fixed
    assert docfigs.stale(fixed, "doc") == []


def test_scale_and_format() -> None:
    data = {"a": {"b": [1.0, 2.5]}}
    assert docfigs.figure("x", "a.b.-1|x1000|,.0f", data) == "2,500"
    assert docfigs.figure("x", "a.b.0", data) == "1.0"
    assert docfigs.figure("x", "a.b.1|.0%", data) == "250%"


@pytest.mark.parametrize(
    "marker",
    [
        "<!-- fig:throughput:phases.-1.no_such_figure -->1<!-- /fig -->",
        "<!-- fig:no_such_benchmark:a -->1<!-- /fig -->",
        "<!-- fig:throughput:layout|.1f -->1<!-- /fig -->",
    ],
)
def test_a_marker_naming_nothing_is_an_error(marker: str) -> None:
    with pytest.raises(docfigs.FigureError):
        docfigs.render(marker, "doc")


def test_a_key_holding_dots_is_found() -> None:
    data = {"figures": {"phases.-1.rate": 3.5}, "phases": [{"rate": 1}]}
    assert docfigs.lookup(data, "figures.phases.-1.rate") == 3.5
    assert docfigs.lookup(data, "phases.-1.rate") == 1


def test_an_optional_figure_says_it_was_not_measured() -> None:
    data = {"phases": [{"rate": 1}]}
    assert docfigs.figure("x", "?one_user.replay_s", data) == docfigs.NOT_MEASURED
    assert docfigs.figure("x", "?phases.0.rate", data) == "1"
    with pytest.raises(docfigs.FigureError):
        docfigs.figure("x", "one_user.replay_s", data)


def test_a_key_holding_spaces_is_found_in_a_marker() -> None:
    """locomo_steps.json's rank table is keyed by phrases ("questions missed")."""
    steps = json.loads((docfigs.RESULTS / "locomo_steps.json").read_text())["steps"]
    missed = steps[-1]["figures"]["ranks"]["multi-hop"]["questions missed"]
    spec = "steps.-1.figures.ranks.multi-hop.questions missed"
    text = f"<!-- fig:locomo_steps:{spec} -->x<!-- /fig -->"
    assert docfigs.render(text, "doc") == text.replace("-->x<", f"-->{missed}<")
