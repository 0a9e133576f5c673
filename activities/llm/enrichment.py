"""Write-time enrichment: what each stored line is indexed with besides its words
(docs/ARCHITECTURE.md, "Dated lines and write-time enrichment").

Runs in the slice step, in the worker, off the hot path. For every line of every draft:

- its date (the day its turn was said) and the absolute dates of its relative expressions
  ("yesterday" said on 8 May 2023 is 7 May 2023, `memory.dates`); the latter are shown with the
  line (`LineNote.when`), the rest is indexed only (`LineNote.terms`);
- what the slicer found in its fragment: with an LLM, the facts stated, the entities and
  keywords in the user's words with general terms for them (`FragmentDraft.facts`, `entities`,
  `keywords`); offline, `heuristic_enrichment`: names, numbers and the general terms of
  `GENERAL_TERMS`. An entity or keyword goes to the lines that say it, a fact to the line it
  shares most words with.

`GENERAL_TERMS` is a small table of everyday words and the general terms a question asks in
("kayaking" -> "outdoor activity", "sport"). It is written from everyday categories, not from
any benchmark's words: `tests/activities/test_enrichment.py` checks it against LoCoMo.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mnemoflow.memory.dates import day_label, resolve_dates, said_on
from mnemoflow.memory.search import split_lines
from mnemoflow.memory.text import normalise, token_list
from mnemoflow.models.fragments import (
    MAX_ENRICHMENT_ITEMS,
    FragmentDraft,
    LineNote,
)
from mnemoflow.models.turns import ChatTurn

__all__ = ["GENERAL_TERMS", "heuristic_enrichment", "with_notes"]

#: What `with_notes` adds (each step of issue 30 measured alone by
#: `benchmarks/_locomo_offline.py --set`): notes at all, and besides the resolved dates the day
#: each line was said and the enrichment.
NOTES = True
INDEX_OWN_DATE = True
INDEX_ENRICHMENT = True

#: Everyday words by general term: each word of a row is indexed with the row's general terms.
_CATEGORIES: dict[str, str] = {
    "outdoor activity|sport": (
        "hiking hike hikes hiked camping camp camped climbing climb climbed mountaineering "
        "kayaking kayak canoeing canoe rafting skiing ski snowboarding surfing surf sailing "
        "fishing hunting trekking backpacking cycling biking bike running run jogging marathon "
        "swimming swim diving snorkeling"
    ),
    "sport|exercise": (
        "football soccer basketball baseball volleyball tennis golf hockey rugby cricket boxing "
        "wrestling yoga pilates gym workout weightlifting karate judo dancing dance"
    ),
    "art|creative hobby": (
        "painting paint painted drawing draw sketching sketch sculpture sculpting pottery "
        "ceramics knitting sewing quilting crochet photography calligraphy woodworking"
    ),
    "music|instrument": (
        "guitar piano violin cello drums drum flute saxophone trumpet ukulele harp clarinet "
        "bass keyboard"
    ),
    "pet|animal": (
        "dog dogs puppy puppies cat cats kitten kittens hamster rabbit bunny parrot goldfish "
        "fish turtle tortoise horse pony guinea lizard snake"
    ),
    "family|relative": (
        "mother mom mum father dad parents sister brother sibling siblings son daughter kids "
        "children husband wife spouse grandma grandmother grandpa grandfather aunt uncle "
        "cousin niece nephew"
    ),
    "travel|trip": (
        "vacation holiday holidays trip trips journey flight flew cruise roadtrip abroad "
        "passport hotel sightseeing tour"
    ),
    "food|cooking": (
        "cooking cook baking bake recipe pizza pasta sushi salad soup bread cake cookies "
        "barbecue dinner lunch breakfast"
    ),
    "reading|book": "novel novels book books reading poetry poem poems author library",
    "work|job": (
        "job career office boss colleague colleagues coworker promotion interview salary "
        "company business"
    ),
    "study|education": (
        "school college university class classes course degree exam exams teacher student "
        "homework lecture"
    ),
    "health|medical": (
        "doctor hospital nurse surgery injury sick illness therapy therapist medicine clinic "
        "diagnosis"
    ),
    "game|entertainment": "movie movies film films concert festival theater theatre videogame",
    "volunteering|charity": (
        "volunteer volunteering volunteered charity donation donated fundraiser"
    ),
}
#: word -> its general terms (from `_CATEGORIES`).
GENERAL_TERMS: dict[str, tuple[str, ...]] = {
    word: tuple(terms.split("|")) for terms, words in _CATEGORIES.items() for word in words.split()
}

_NAME = re.compile(r"(?<![\w'’])[A-Z][a-z]+(?:[-'][A-Z]?[a-z]+)*(?![\w'’])")
_SENTENCE_START = re.compile(r"(?:^|[.!?…:]\s+|\n|\"|“)\s*$")
_NUMBER = re.compile(r"(?<![\w.])\$?\d[\d,.:/%-]*\w*")
_NUMBER_WORDS = {
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
    "eleven": "11",
    "twelve": "12",
    "twenty": "20",
    "hundred": "100",
    "thousand": "1000",
}
_NUMBER_WORD = re.compile(rf"\b(?:{'|'.join(_NUMBER_WORDS)})\b", re.IGNORECASE)
#: Capitalised words that are not names (sentence openers the start test misses, greetings).
_NOT_NAMES = frozenset(
    "I I'm I've I'll I'd Hey Hi Hello Thanks Thank Wow Yes Yeah No Oh Ok Okay Sure Well So And "
    "But Also Just Really That This It The A An My Your Our We You He She They What When Where "
    "Why How Who Which User Assistant".split()
)
_SPEAKER = re.compile(r"^(?:User|Assistant)(?: \([^)\n]*\))?: ?")


def heuristic_enrichment(content: str) -> dict[str, Any]:
    """What can be found in a fragment's content without a model: names (capitalised words not
    opening a sentence), numbers (digits, and number words as digits) as entities; every word
    of `GENERAL_TERMS` as a keyword with its general terms. Raw, like a slicer's answer."""
    entities: list[str] = []
    keywords: list[dict[str, object]] = []
    for line in content.splitlines():
        text = _SPEAKER.sub("", line)
        for m in _NAME.finditer(text):
            word = m.group(0)
            if word in _NOT_NAMES or _SENTENCE_START.search(text[: m.start()]):
                continue
            entities.append(word)
        entities.extend(m.group(0).rstrip(".,:") for m in _NUMBER.finditer(text))
        entities.extend(_NUMBER_WORDS[m.group(0).lower()] for m in _NUMBER_WORD.finditer(text))
        for word in re.findall(r"[a-z]+", text.lower()):
            if word in GENERAL_TERMS:
                keywords.append({"said": word, "general": list(GENERAL_TERMS[word])})
    return {
        "entities": list(dict.fromkeys(entities))[: MAX_ENRICHMENT_ITEMS * 2],
        "keywords": list({str(k["said"]): k for k in keywords}.values())[:MAX_ENRICHMENT_ITEMS],
    }


def _turn_of(line: str, turns: Sequence[ChatTurn], lo: int, hi: int) -> ChatTurn | None:
    """The turn a fragment line quotes: among the draft's turns first, then any."""
    said = normalise(_SPEAKER.sub("", line))
    if not said:
        return None
    for group in (turns[lo : hi + 1], turns):
        for turn in group:
            if said in normalise(turn.content):
                return turn
    return None


def _says(folded: str, term: str) -> bool:
    """Whether a line (case-folded, without its speaker) says `term` as a whole word."""
    return re.search(rf"(?<!\w){re.escape(term.casefold())}(?!\w)", folded) is not None


def _best_line(text: str, tokens: Sequence[set[str]]) -> int:
    """The line sharing most content tokens with `text` (the first on ties, 0 when none)."""
    wanted = set(token_list(normalise(text)))
    if not tokens:
        return 0
    scores = [len(wanted & have) for have in tokens]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def _notes(draft: FragmentDraft, turns: Sequence[ChatTurn]) -> list[LineNote]:
    lines = split_lines(draft.content)
    if not lines:
        return []
    last = len(turns) - 1
    lo = min(max(draft.start_idx, 0), last)
    hi = min(max(draft.end_idx, lo), last)
    newest = max(t.time for t in turns[lo : hi + 1])
    tag_day = day_label(said_on(newest)) if newest > 0 else ""
    folded = [_SPEAKER.sub("", line).casefold() for line in lines]
    tokens = [set(token_list(normalise(line))) for line in lines]
    shown: list[list[str]] = [[] for _ in lines]
    terms: list[list[str]] = [[] for _ in lines]
    for n, line in enumerate(lines):
        turn = _turn_of(line, turns, lo, hi)
        when = turn.time if turn is not None else newest
        if when > 0:
            own = day_label(said_on(when))
            if INDEX_OWN_DATE:
                terms[n].append(own)
            if own != tag_day:
                shown[n].append(f"said {own}")
        for found in resolve_dates(line, when):
            shown[n].append(f"{found.said} = {found.label}")
            terms[n].append(found.label)
    if not INDEX_ENRICHMENT:
        return _joined(shown, terms)
    for entity in draft.entities:
        hits = [n for n, f in enumerate(folded) if _says(f, entity)]
        for n in hits or [_best_line(entity, tokens)]:
            terms[n].append(entity)
    for keyword in draft.keywords:
        hits = [n for n, f in enumerate(folded) if _says(f, keyword.said)]
        for n in hits or [_best_line(keyword.said, tokens)]:
            terms[n].extend([keyword.said, *keyword.general])
    for fact in draft.facts:
        terms[_best_line(fact, tokens)].append(fact)
    return _joined(shown, terms)


#: Longest indexed terms of one line: a round's lines are bounded in number
#: (`max_turns_per_round`), so this bounds what the notes add to a round's payloads.
MAX_TERMS_CHARS = 600


def _joined(shown: list[list[str]], terms: list[list[str]]) -> list[LineNote]:
    return [
        LineNote(when="; ".join(s), terms=" | ".join(dict.fromkeys(t))[:MAX_TERMS_CHARS])
        for s, t in zip(shown, terms, strict=True)
    ]


def with_notes(drafts: Sequence[FragmentDraft], turns: Sequence[ChatTurn]) -> list[FragmentDraft]:
    """The drafts, each with one `LineNote` per line of its content (`memory.search.split_lines`,
    the lines the search indexes): run last in the slice step, once the content is final."""
    if not turns or not NOTES:
        return list(drafts)
    return [d.model_copy(update={"notes": _notes(d, turns)}) for d in drafts]
