"""Issue 30's multi-hop options (memory/search.py, all off by default, measured and left out in
docs/MEMORY_QUALITY.md): the second query built from what the first lines' notes name, lines
grouped by what they name, and lines spread over threads. Each does what it says when switched
on, and nothing when off."""

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


def _thread_doc(fid: str, thread: str, start: int, text: str) -> SearchDoc:
    fragment = ContextFragment(
        id=fid,
        theme="t",
        types=["chat"],
        content=text,
        thread_id=thread,
        start_pos=start,
        end_pos=start + 1,
    )
    return SearchDoc(fragment, NOW - 86400)


def test_thread_spread_puts_a_threads_lines_past_its_cap_after_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # three threads, the first holding the best matches; one line a fragment, far apart in
    # their threads so no window joins them
    docs = [
        _thread_doc(f"a{i}", "a", 10 * i, f"User (Jo): Pottery class pottery clay pottery {i}.")
        for i in range(4)
    ]
    docs += [_thread_doc("b0", "b", 0, "User (Jo): Pottery with Ana on Sunday.")]
    docs += [_thread_doc("c0", "c", 0, "User (Jo): Camping trip, some pottery too.")]
    index = SearchIndex(docs)
    before = index.line_ranking("pottery", [])
    thread_of = [index.docs[index.line_refs[r][0]].fragment.thread_id for r in before]
    assert thread_of[:4] == ["a", "a", "a", "a"], "the fixture must rank one thread first"
    monkeypatch.setattr(search, "THREAD_SPREAD", len(before))
    monkeypatch.setattr(search, "THREAD_SPREAD_CAP", 2)
    after = index.line_ranking("pottery", [])
    assert sorted(after) == sorted(before)  # the same lines, none lost or added
    threads = [index.docs[index.line_refs[r][0]].fragment.thread_id for r in after]
    assert threads[:2] == ["a", "a"] and threads[4:] == ["a", "a"]
    assert sorted(threads[2:4]) == ["b", "c"]  # the other threads come up past the cap
    assert after[:2] == before[:2] and after[4:] == before[2:4]
    monkeypatch.setattr(search, "THREAD_SPREAD", 0)
    assert index.line_ranking("pottery", []) == before  # off: the ranking as it was
