"""Issue 30's multi-hop options (memory/search.py, both off by default, measured and left out in
docs/MEMORY_QUALITY.md): the second query built from what the first lines' notes name, and
lines grouped by what they name. Each does what it says when switched on, and nothing when off."""

from __future__ import annotations

import pytest

from mnemoflow.memory import search
from mnemoflow.memory.search import CandidateIndex, SearchDoc, SearchIndex
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.fragments import LineNote

NOW = 1_700_000_000.0


def _doc(fid: str, lines: list[tuple[str, str]], age_days: int) -> SearchDoc:
    content = "\n".join(text for text, _ in lines)
    notes = tuple(LineNote(terms=terms) for _, terms in lines)
    fragment = ContextFragment(id=fid, theme="t", types=["chat"], content=content)
    return SearchDoc(fragment, NOW - 86400 * age_days, notes=notes)


def _climb_index() -> SearchIndex:
    filler = [
        _doc(f"f{i}", [(f"User (Jo): Line {i} on groceries and rain number {i}.", "")], i + 5)
        for i in range(12)
    ]
    climb = _doc("climb", [("User (Jo): I went climbing in the Alps.", "Priya | climbing")], 3)
    move = _doc("move", [("User (Priya): I moved to Denver in 2020.", "Priya | Denver | 2020")], 2)
    return SearchIndex([*filler, climb, move])


def _text(index: SearchIndex, ref: int) -> str:
    doc, n = index.line_refs[ref]
    return index.lines[doc][n]


def test_second_query_brings_up_a_line_named_by_the_first_lines_notes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = _climb_index()
    before = [_text(index, r) for r in index.line_ranking("climbing", [])]
    assert before[0].startswith("User (Jo): I went climbing")
    assert not any("Denver" in line for line in before)  # no word of the question
    monkeypatch.setattr(search, "SECOND_QUERY_LINES", 1)
    after = [_text(index, r) for r in index.line_ranking("climbing", [])]
    assert after[0] == before[0]  # the first query still leads
    assert after[1] == "User (Priya): I moved to Denver in 2020."
    # dates and numbers in the notes make no second query: only names and keywords do
    assert index._entities(index.line_refs.index((13, 0))) == ["priya", "denver"]


def test_second_query_is_off_at_zero_and_for_the_stores_candidates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = _climb_index()
    plain = index.line_ranking("climbing", [])
    monkeypatch.setattr(search, "SECOND_QUERY_LINES", 0)
    assert index.line_ranking("climbing", []) == plain
    candidates = CandidateIndex(index.docs, relevance={}, line_scores={})
    assert candidates.expansion_scores(["priya"]) is None


def test_entity_groups_put_lines_naming_nothing_new_after_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [
        ("User (Jo): The garden tomatoes came up red.", "tomatoes"),
        ("User (Jo): The garden tomatoes came up red again, more tomatoes.", "tomatoes"),
        ("User (Jo): The garden tomatoes got a visit from Ana.", "Ana"),
        ("User (Jo): Nothing in the garden today.", ""),
    ]
    index = SearchIndex([_doc("g", lines, 1)])
    before = index.line_ranking("garden tomatoes", [])
    monkeypatch.setattr(search, "ENTITY_GROUPS", len(before))
    after = index.line_ranking("garden tomatoes", [])
    assert sorted(after) == sorted(before)  # the same lines, none lost or added
    seen: set[str] = set()
    repeats: list[int] = []
    for ref in before:
        named = set(index._entities(ref))
        if named and not named - seen:
            repeats.append(ref)
        seen |= named
    assert repeats, "the fixture must rank a repeat of what an earlier line named"
    firsts = [ref for ref in before if ref not in repeats]
    assert after == [*firsts, *repeats]
