"""Fragments (themed slices of a conversation) and what selection says about them."""

from __future__ import annotations

import re
from typing import NamedTuple

from pydantic import BaseModel, Field

MAX_THEME_KEY_CHARS = 200
_SPEAKER = re.compile(r"^(User|Assistant)(?: \([^)\n]*\))?: ?")


class SpokenLine(NamedTuple):
    """One turn (or one piece of a long turn) in a fragment's content."""

    role: str  # "human" (`User...:`), "ai" (`Assistant...:`), "" before any speaker
    text: str  # verbatim, continuation lines included
    raw: str  # as the content holds it, speaker label included


def spoken_lines(content: str) -> list[SpokenLine]:
    """A fragment's content as the turns it quotes: each `User (Ada): ...` or `Assistant: ...`
    line starts one, and a line without a speaker continues the one before it (the slicers
    write turns verbatim, `activities.llm.base.speaker_label`)."""
    out: list[SpokenLine] = []
    for line in content.split("\n"):
        found = _SPEAKER.match(line)
        if found is None and out:
            last = out[-1]
            out[-1] = SpokenLine(last.role, f"{last.text}\n{line}", f"{last.raw}\n{line}")
            continue
        role = "" if found is None else ("human" if found.group(1) == "User" else "ai")
        out.append(SpokenLine(role, line[found.end() :] if found else line, line))
    return [s._replace(text=s.text.strip(), raw=s.raw.rstrip()) for s in out if s.raw.strip()]


def piece_at(text: str, piece: str) -> tuple[int, int] | None:
    """Where `piece` stands whole in `text`: a piece the slicer cut a long turn into, never
    part of a longer word ("message 1" is not in "message 12"). Its edges may meet spaces,
    punctuation or an end of the text (Chinese sentences meet at "。", with no space). The
    slicer joins a piece's sentences with its own spacing, so spacing may differ."""
    spans = _exact_spans(text, piece)
    if not spans:
        # Spacing aside, the piece is there only if its other characters run unbroken in the
        # text's (str.isspace is what `\s` matches): checked first, because a pattern compiled
        # for each of a call's pieces (Python keeps 512) cost the model call ~20 ms.
        bare = "".join(piece.split())  # str.split() splits where str.isspace() is true
        if bare and bare in "".join(text.split()):
            loose = r"\s*".join(re.escape(c) for c in bare)
            spans = [(m.start(), m.end()) for m in re.finditer(loose, text)]
    for at, end in spans:
        opens = at == 0 or not (text[at - 1].isalnum() and piece[0].isalnum())
        closes = end == len(text) or not (text[end - 1].isalnum() and text[end].isalnum())
        if opens and closes:
            return at, end
    return None


def _exact_spans(text: str, piece: str) -> list[tuple[int, int]]:
    """Where `piece` stands in `text`, left to right, not overlapping (as `re.finditer` of the
    escaped piece finds it)."""
    if not piece:
        return [(at, at) for at in range(len(text) + 1)]
    spans, at = [], text.find(piece)
    while at >= 0:
        spans.append((at, at + len(piece)))
        at = text.find(piece, at + len(piece))
    return spans


#: A forgotten text shorter than this (non-space characters) is not cut out of other text:
#: "Thanks!" or "好的" said again is not a quote of what was forgotten.
QUOTE_MIN_CHARS = 16


def quoted_texts(content: str) -> list[str]:
    """What a forgotten row's words are, to find where other text quotes them: each of its
    spoken lines of QUOTE_MIN_CHARS or more (a remembered fact, with no speaker: its text)."""
    lines = [ln.text for ln in spoken_lines(content) if ln.role and ln.text]
    texts = lines or [content.strip()]
    return [t for t in texts if len("".join(t.split())) >= QUOTE_MIN_CHARS]


def cut_quotes(text: str, quotes: list[str]) -> str:
    """`text` without each of `quotes` where it stands whole (`piece_at`), spaces closed up."""
    for quote in quotes:
        while (found := piece_at(text, quote)) is not None:
            text = f"{text[: found[0]].rstrip()} {text[found[1] :].lstrip()}".strip()
    return text


def cut_quoted_lines(content: str, quotes: list[str]) -> str | None:
    """A row's content with `quotes` cut out of each spoken line (`cut_quotes`); a line left
    with nothing goes; None when no spoken line is left."""
    kept = []
    for line in spoken_lines(content):
        if not line.role:
            kept.append(line.raw)
            continue
        text = cut_quotes(line.text, quotes)
        if text == line.text:
            kept.append(line.raw)
        elif any(c.isalnum() for c in text):
            label = _SPEAKER.match(line.raw)
            kept.append(f"{label.group(0) if label else ''}{text}")
    if not any(_SPEAKER.match(raw) for raw in kept):
        return None
    return "\n".join(kept)


def theme_key(theme: str) -> str:
    """What makes two themes the same: an LLM writes "Travel " and "travel" for one theme.

    The one definition for the tuned-parameter cache (keyed by it in workflow state) and the
    selection's per-theme cap: case-folded, whitespace collapsed, bounded.
    """
    return " ".join(theme.split()).casefold()[:MAX_THEME_KEY_CHARS]


#: Bounds of a model's enrichment: characters per item, items per list.
MAX_ENRICHMENT_CHARS = 200
MAX_ENRICHMENT_ITEMS = 16


class Keyword(BaseModel):
    """A keyword of a fragment in the words said, with general terms for it ("mountaineering"
    -> "outdoor activity", "hiking"): a question asks in the general terms."""

    said: str = Field(min_length=1, max_length=MAX_ENRICHMENT_CHARS)
    general: list[str] = Field(default_factory=list)


class LineNote(BaseModel):
    """What a fragment's line is indexed with besides its words (docs/ARCHITECTURE.md, "Dated
    lines and write-time enrichment"): `when`, the absolute dates of its relative expressions
    (and its own date when it differs from its fragment's), shown with the line; `terms`, its
    date, names, numbers, facts and keywords, indexed and never shown."""

    when: str = ""
    terms: str = ""


class FragmentDraft(BaseModel):
    """What a slicer proposes: a theme, types, the content, and the turns it came from; what the
    slicer found in it (facts, entities, keywords), and per line what it is indexed with
    (`notes`, one per line of `memory.search.split_lines(content)`, made after the slice)."""

    theme: str = Field(min_length=1, max_length=200)
    types: list[str] = Field(min_length=1)
    content: str = Field(min_length=1)
    start_idx: int = Field(ge=0, description="first turn index within the sliced batch")
    end_idx: int = Field(ge=0, description="last turn index within the sliced batch (inclusive)")
    facts: list[str] = Field(default_factory=list)
    entities: list[str] = Field(default_factory=list)
    keywords: list[Keyword] = Field(default_factory=list)
    notes: list[LineNote] = Field(default_factory=list)


class Fragment(BaseModel):
    """A stored fragment, as kept in Milvus (without its vector)."""

    id: str
    user_id: str
    theme: str
    types: list[str]
    content: str
    created_at: float
    reinforced_at: float
    strengthen_count: int = 0
    round_no: int = 0
    thread_id: str = ""
    start_pos: int = 0
    end_pos: int = 0
    explicit: bool = False
    notes: list[LineNote] = Field(
        default_factory=list,
        description="one per line of the content, or none (stored before notes, or rewritten)",
    )


class Candidate(BaseModel):
    """A fragment with its cosine similarity to the query, the input of selection."""

    fragment: Fragment
    cos: float


class ScoredCandidate(BaseModel):
    """One candidate's line in the scoring log: every term, weighted, and whether it was picked."""

    fragment_id: str
    theme: str
    types: list[str]
    cos: float
    R: float
    T: float
    F: float
    alpha_R: float
    beta_T: float
    gamma_F: float
    delta: float
    score: float
    picked: bool
    reason: str = ""


class SelectionLog(BaseModel):
    """One selection: when, with which parameters, and every candidate's terms."""

    at: float
    theme: str
    params_source: str
    candidates: list[ScoredCandidate] = Field(default_factory=list)
