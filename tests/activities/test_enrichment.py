"""Write-time enrichment (activities/llm/enrichment.py): what each stored line is indexed with,
the validation of a model's enrichment, and the offline table's independence from LoCoMo."""

from __future__ import annotations

import asyncio
import calendar
import json
import os
import re
from pathlib import Path

import pytest

from mnemoflow.activities.llm.base import validate_drafts
from mnemoflow.activities.llm.enrichment import (
    GENERAL_TERMS,
    MAX_TERMS_CHARS,
    heuristic_enrichment,
    with_notes,
)
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.memory.search import split_lines
from mnemoflow.models.errors import MalformedModelOutputError
from mnemoflow.models.fragments import FragmentDraft, Keyword
from mnemoflow.models.turns import ChatTurn

MAY_8 = float(calendar.timegm((2023, 5, 8, 13, 56, 0, 0, 0, 0)))
#: The LoCoMo conversations beside the repository (as benchmarks/locomo.py finds them), or where
#: LOCOMO_DATA says; a worktree sits one level deeper.
_ROOT = Path(__file__).resolve().parents[2]
LOCOMO = next(
    (
        p
        for p in (
            Path(os.environ.get("LOCOMO_DATA", "/nonexistent")),
            _ROOT.parent / "shared" / "data" / "locomo",
            _ROOT.parent.parent / "shared" / "data" / "locomo",
        )
        if p.is_dir()
    ),
    _ROOT.parent / "shared" / "data" / "locomo",
)


def turn(pos: int, role: str, text: str, at: float = MAY_8, name: str = "") -> ChatTurn:
    return ChatTurn(
        thread_id="t", position=pos, role=role, content=text, time=at + pos, name=name or None
    )  # type: ignore[arg-type]


def test_heuristic_finds_names_numbers_and_general_terms() -> None:
    content = (
        "User (Ana): Hey! I went kayaking with Tomasz near Lisbon, three hours.\n"
        "Assistant: Nice. Your order 4471 shipped on 3/12."
    )
    found = heuristic_enrichment(content)
    # names not opening a sentence, speakers' labels and greetings left out
    assert {"Tomasz", "Lisbon"} <= set(found["entities"])
    assert not {"Hey", "User", "Ana", "Nice", "Your"} & set(found["entities"])
    assert {"3", "4471", "3/12"} <= set(found["entities"])
    assert {"said": "kayaking", "general": ["outdoor activity", "sport"]} in found["keywords"]


def test_lines_get_their_date_resolved_dates_and_the_terms_they_say() -> None:
    turns = [
        turn(0, "human", "I went to a support group yesterday.", name="Ana"),
        turn(1, "ai", "How was it? Did Tomasz come?"),
        turn(2, "human", "He did. Last Saturday we went mountaineering.", name="Ana"),
    ]
    content = "\n".join(
        [
            "User (Ana): I went to a support group yesterday.",
            "Assistant: How was it? Did Tomasz come?",
            "User (Ana): He did. Last Saturday we went mountaineering.",
        ]
    )
    draft = FragmentDraft(
        theme="t",
        types=["episode"],
        content=content,
        start_idx=0,
        end_idx=2,
        facts=["Ana and Tomasz went mountaineering on 6 May 2023"],
        entities=["Tomasz"],
        keywords=[Keyword(said="mountaineering", general=["outdoor activity", "hiking"])],
    )
    (noted,) = with_notes([draft], turns)
    assert len(noted.notes) == len(split_lines(content)) == 3
    first, second, third = noted.notes
    assert first.when == "yesterday = 7 May 2023"
    assert "8 May 2023" in first.terms and "7 May 2023" in first.terms
    assert second.when == "" and "Tomasz" in second.terms
    assert third.when == "Last Saturday = 6 May 2023"
    for term in ("outdoor activity", "hiking", "Ana and Tomasz went mountaineering"):
        assert term in third.terms
    assert "outdoor activity" not in first.terms + second.terms


def test_a_line_said_on_another_day_than_its_fragment_shows_its_own_date() -> None:
    day = 86400.0
    turns = [turn(0, "human", "Booked the flight today."), turn(1, "ai", "Great.", MAY_8 + day)]
    draft = FragmentDraft(
        theme="t",
        types=["chat"],
        content="User: Booked the flight today.\nAssistant: Great.",
        start_idx=0,
        end_idx=1,
    )
    (noted,) = with_notes([draft], turns)
    # the fragment is dated by its newest turn (9 May): the older line says its own date
    assert noted.notes[0].when == "said 8 May 2023; today = 8 May 2023"
    assert noted.notes[1].when == ""


def test_the_offline_slicer_enriches_what_it_slices() -> None:
    turns = [
        turn(0, "human", "My sister Joanna started violin lessons two weeks ago.", name="Ana"),
        turn(1, "ai", "Lovely!"),
    ]
    raw = asyncio.run(HeuristicMemoryModels().slice(turns, 4)).drafts
    drafts = with_notes(validate_drafts(raw, len(turns), 4), turns)
    notes = " ".join(n.terms + " " + n.when for d in drafts for n in d.notes)
    for term in ("Joanna", "music", "instrument", "family", "24 April 2023"):
        assert term in notes


def test_a_models_enrichment_is_repaired_like_the_other_fields() -> None:
    raw = [
        {
            "theme": "t",
            "types": ["fact"],
            "content": "User: I climb.",
            "start_idx": 0,
            "end_idx": 0,
            "facts": "climbs; on weekends",  # a string: split
            "entities": ["Ana", 7, None, "", {"x": 1}, "x" * 500],  # non-text dropped, cut
            "keywords": [
                "bouldering",
                {"term": "climb", "general": "sport, outdoor activity"},
                {"said": ""},  # nothing said: dropped
                42,
            ],
        }
    ]
    (draft,) = validate_drafts(raw, 1)
    assert draft.facts == ["climbs", "on weekends"]
    assert draft.entities == ["Ana", "7", "x" * 200]
    assert draft.keywords == [
        Keyword(said="bouldering"),
        Keyword(said="climb", general=["sport", "outdoor activity"]),
    ]
    (plain,) = validate_drafts([{k: raw[0][k] for k in list(raw[0])[:5]}], 1)
    assert (plain.facts, plain.entities, plain.keywords) == ([], [], [])


@pytest.mark.parametrize("key", ["facts", "entities", "keywords"])
def test_enrichment_of_the_wrong_shape_is_malformed(key: str) -> None:
    raw = [{"theme": "t", "types": [], "content": "x", "start_idx": 0, "end_idx": 0, key: 3.5}]
    with pytest.raises(MalformedModelOutputError, match=key):
        validate_drafts(raw, 1)


def _locomo_words() -> tuple[set[str], set[str]]:
    """Every word of the LoCoMo conversations (turns, questions, answers), lower-cased, and
    their proper nouns: the speakers' names and the words that, where they do not open a
    sentence, are never written in lower case (people, pets, places, titles, brands)."""
    lower: set[str] = set()
    capital: set[str] = set()
    opening: set[str] = set()
    names: set[str] = set()
    for file in sorted(LOCOMO.glob("*.json")):
        raw = json.loads(file.read_text())
        conv = raw.get("conversation", raw)
        names |= {conv["speaker_a"].casefold(), conv["speaker_b"].casefold()}
        texts = [
            t.get("text", "")
            for k, v in conv.items()
            if k.startswith("session_") and isinstance(v, list)
            for t in v
        ]
        texts += [f"{q.get('question', '')} {q.get('answer', '')}" for q in raw.get("qa", [])]
        for text in texts:
            for m in re.finditer(r"[A-Za-z]+", text):
                word = m.group(0)
                if not word[0].isupper():
                    lower.add(word.casefold())
                elif not re.search(r"(?:^|[.!?:\"]\s*)$", text[: m.start()].rstrip(" ")):
                    capital.add(word.casefold())  # capitalised where a sentence goes on
                else:
                    opening.add(word.casefold())  # opens a sentence: says nothing either way
    return lower | capital | opening, names | (capital - lower)


@pytest.mark.skipif(not LOCOMO.is_dir(), reason="the LoCoMo conversations are not here")
def test_the_general_term_table_names_no_locomo_word() -> None:
    """The offline table must not be tuned to LoCoMo. No general English word list is
    installed here (no /usr/share/dict, no word-frequency package), so two checks stand in:

    - it names no word specific to LoCoMo's people and places: none of the speakers' names,
      and no word the five conversations only ever write capitalised (names of people and
      pets, places, titles, brands): those are LoCoMo's own vocabulary, not English;
    - it was not picked from LoCoMo: it is a list of everyday categories, most of whose words
      these conversations never use. A table built from LoCoMo's words (the evidence of its
      questions) would find nearly all of them there; at least 40% must be absent (the words
      and their general terms alike).
    """
    vocabulary, proper = _locomo_words()
    words = set(GENERAL_TERMS) | {
        part for terms in GENERAL_TERMS.values() for term in terms for part in term.split()
    }
    assert not words & proper, sorted(words & proper)
    absent = words - vocabulary
    assert len(absent) >= 0.4 * len(words), (len(absent), len(words))


def test_a_lines_terms_are_bounded() -> None:
    turns = [turn(0, "human", "We met Ann, Bo, Cy and Di.")]
    facts = [f"fact number {i} about Ann, Bo, Cy and Di, " + "x" * 150 for i in range(16)]
    draft = FragmentDraft(
        theme="t",
        types=["fact"],
        content="User: We met Ann, Bo, Cy and Di.",
        start_idx=0,
        end_idx=0,
        facts=facts,
    )
    (noted,) = with_notes([draft], turns)
    assert 0 < len(noted.notes[0].terms) <= MAX_TERMS_CHARS
