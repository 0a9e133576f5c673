"""Lines indexed with their notes (dates, enrichment): found by what the notes say, shown with
the dates they resolve and nothing else, counted in the budget as shown; fragments stored
before the notes (none) or rewritten since (not one per line) are searched by their words."""

from __future__ import annotations

from mnemoflow.memory.prompt import memory_tokens
from mnemoflow.memory.search import SearchDoc, SearchIndex, noted_lines
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.fragments import LineNote
from mnemoflow.models.profile import UserProfile

NOW = 1_700_000_000.0
CLIMB = "User (Jo): Last Saturday I went mountaineering with my cousin."
FILLER = [f"User (Jo): Line {i} about the weather and groceries number {i}." for i in range(40)]


def _docs(notes: bool) -> list[SearchDoc]:
    docs = []
    for i in range(0, 40, 4):
        content = "\n".join(FILLER[i : i + 4])
        frag = ContextFragment(id=f"f{i}", theme="t", types=["chat"], content=content)
        docs.append(SearchDoc(frag, NOW - 86400 * (i + 2)))
    content = f"{CLIMB}\nAssistant: Wow, how high did you get?"
    frag = ContextFragment(id="climb", theme="t", types=["episode"], content=content)
    note = LineNote(
        when="Last Saturday = 6 May 2023",
        terms="8 May 2023 | 6 May 2023 | mountaineering | outdoor activity | hiking",
    )
    docs.append(SearchDoc(frag, NOW - 86400, notes=(note, LineNote()) if notes else ()))
    return docs


def _excerpt(index: SearchIndex, query: str, budget: int = 1200) -> str:
    config = MemoryConfig(memory_budget_tokens=budget)
    found = index.excerpts(query, None, config, NOW)
    return "\n".join(f.content for f in found)


def test_a_line_is_found_by_the_general_terms_and_dates_of_its_notes() -> None:
    question = "What outdoor activities has Jo done? Anything on 6 May 2023?"
    assert CLIMB not in _excerpt(SearchIndex(_docs(notes=False)), "outdoor activities hiking", 64)
    shown = _excerpt(SearchIndex(_docs(notes=True)), question, 64)
    # the line verbatim, then only the resolved date: the indexed terms are never shown
    assert f"{CLIMB} [Last Saturday = 6 May 2023]" in shown
    assert "outdoor activity" not in shown and "hiking" not in shown


def test_the_budget_counts_the_dates_as_shown() -> None:
    index = SearchIndex(_docs(notes=True))
    for budget in (64, 80, 120, 200):
        config = MemoryConfig(memory_budget_tokens=budget)
        found = index.excerpts("mountaineering weather groceries", None, config, NOW)
        assert found and memory_tokens(UserProfile(), found) <= budget


def test_notes_that_do_not_match_the_lines_are_ignored() -> None:
    content = "User: one\nAssistant: two"
    note = LineNote(when="yesterday = 1 May 2023", terms="secret")
    assert noted_lines(content, [note]) == (["User: one", "Assistant: two"],) * 2
    shown, indexed = noted_lines(content, [note, LineNote()])
    assert shown == ["User: one [yesterday = 1 May 2023]", "Assistant: two"]
    assert indexed == ["User: one [yesterday = 1 May 2023] secret", "Assistant: two"]


def test_corpus_entries_written_before_the_notes_still_load() -> None:
    """A user's corpus in Redis holds entries written before the notes (no `notes` key) beside
    new ones: both are searched, the old by its words alone."""
    import json

    from mnemoflow.middleware.search import build_index
    from mnemoflow.models.corpus import CorpusEntry

    old = {"id": "old", "theme": "t", "types": ["chat"], "content": "User: I went yesterday."}
    new = CorpusEntry(
        id="new",
        theme="t",
        types=["chat"],
        content="User: We went kayaking yesterday.",
        notes=[LineNote(when="yesterday = 1 May 2023", terms="outdoor activity")],
    )
    index = build_index({b"old": json.dumps(old), b"new": new.model_dump_json()})
    notes = {d.fragment.id: d.notes for d in index.docs}
    assert notes == {"old": (), "new": tuple(new.notes)}
    assert sorted(index.lines) == [
        ["User: I went yesterday."],
        ["User: We went kayaking yesterday. [yesterday = 1 May 2023]"],
    ]
    found = index.excerpts("outdoor activity", None, MemoryConfig(), NOW)
    assert [f.id for f in found] == ["new"]
