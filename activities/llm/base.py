"""The memory-model protocol (slice, tune, induct) and the validation of what a model answers.

A memory model is anything that can do the three LLM jobs of a round. Two implementations ship:
`HeuristicMemoryModels` (deterministic, offline) and `LangChainMemoryModels` (any chat model with
tool calling, DeepSeek by default). Whatever a model answers is untrusted: `validate_drafts` turns
raw slicer output into `FragmentDraft`s, repairing what can be repaired (unknown types, indexes
out of range) and raising `MalformedModelOutputError` for what cannot; `with_every_turn` adds,
verbatim, whatever the drafts did not quote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mnemoflow.activities.llm.heuristic_rules import split_sentences
from mnemoflow.memory.text import cut_point, estimate_tokens, normalise
from mnemoflow.models.config import FRAGMENT_TYPES
from mnemoflow.models.errors import InvalidInputError, MalformedModelOutputError
from mnemoflow.models.fragments import (
    MAX_ENRICHMENT_CHARS,
    MAX_ENRICHMENT_ITEMS,
    Fragment,
    FragmentDraft,
    Keyword,
)
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn
from mnemoflow.models.usage import LLMUsage

MAX_THEME_CHARS = 200
#: A fragment made of turns the model left out is cut at about this many (estimated) tokens,
#: the offline slicer's bound.
MAX_KEPT_TURN_TOKENS = 160
FALLBACK_THEME = "general"
FALLBACK_TYPES: tuple[str, ...] = ("chat",)
#: Longest fragment content in UTF-8 bytes: below Milvus's VARCHAR ceiling (65,535, which the
#: store clips to), with room for what is added to a draft's content after the slice. A round's
#: drafts are bounded in number (`max_fragments`), so long rounds of CJK or emoji text made
#: drafts of 100 KB and more, whose tails the store cut off.
MAX_FRAGMENT_BYTES = 60_000


@dataclass
class SlicedDrafts:
    """A slicer's raw answer (one mapping per proposed fragment) and what it cost."""

    drafts: list[dict[str, Any]]
    usage: LLMUsage = field(default_factory=LLMUsage)


@dataclass
class TunedRaw:
    """A tuner's raw answer (weights as the model gave them, not yet renormalised)."""

    params: dict[str, Any]
    usage: LLMUsage = field(default_factory=LLMUsage)


@dataclass
class InductedProfile:
    """An inducer's profile update (to be merged into the stored profile) and its cost."""

    update: UserProfile
    usage: LLMUsage = field(default_factory=LLMUsage)


@runtime_checkable
class MemoryModels(Protocol):
    """The three LLM jobs of the memory model; `name` shows up in activity outputs and costs."""

    name: str

    async def slice(self, turns: list[ChatTurn], max_fragments: int) -> SlicedDrafts:
        """Split turns into themed fragment drafts (indexes relative to `turns`)."""
        ...

    async def tune(self, theme: str, samples: list[str], types: list[str]) -> TunedRaw:
        """Propose scoring weights for a theme, given sample contents and their types."""
        ...

    async def induct(self, profile: UserProfile, fragments: list[Fragment]) -> InductedProfile:
        """Propose a profile update from fragments (only what the fragments say)."""
        ...


def _index(value: object, key: str, position: int) -> int:
    """An index from ints, integral floats or numeric strings; anything else is malformed."""
    if isinstance(value, bool):
        raise MalformedModelOutputError(f"fragment {position}: {key} is a boolean, not an index")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise MalformedModelOutputError(f"fragment {position}: {key}={value!r} is not an integer index")


def _types(value: object, position: int) -> list[str]:
    """Known fragment types in first-seen order; none left means plain chat."""
    if isinstance(value, str):
        value = value.replace("|", ",").split(",")  # "fact, preference" is a common LLM habit
    if not isinstance(value, Sequence):
        raise MalformedModelOutputError(f"fragment {position}: types must be a list of strings")
    known: list[str] = []
    for item in value:
        name = item.strip().lower() if isinstance(item, str) else ""
        if name in FRAGMENT_TYPES and name not in known:
            known.append(name)
    return known or list(FALLBACK_TYPES)


def _text(item: Mapping[str, Any], key: str, position: int) -> str:
    value = item.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedModelOutputError(f"fragment {position}: {key} must be a string")
    return value.strip()


def _strings(value: object, key: str, position: int) -> list[str]:
    """A list of short strings from what a model gave: None is none, a string is split at
    commas and semicolons, items that are not strings (or are blank) are dropped, at most
    MAX_ENRICHMENT_ITEMS of MAX_ENRICHMENT_CHARS each; anything else is malformed."""
    if value is None:
        return []
    if isinstance(value, str):
        value = re.split(r"[,;\n]", value)
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise MalformedModelOutputError(f"fragment {position}: {key} must be a list of strings")
    out = []
    for item in value:
        if isinstance(item, int | float) and not isinstance(item, bool):
            item = str(item)
        if isinstance(item, str) and item.strip():
            out.append(" ".join(item.split())[:MAX_ENRICHMENT_CHARS])
    return list(dict.fromkeys(out))[:MAX_ENRICHMENT_ITEMS]


def _keywords(value: object, position: int) -> list[Keyword]:
    """Keywords from what a model gave: each an object {said, general} (`term` or `keyword`
    for `said` too) or a plain string (said, no general terms); repaired like `_strings`."""
    if value is None:
        return []
    if isinstance(value, str) or isinstance(value, Mapping):
        value = [value] if isinstance(value, Mapping) else _strings(value, "keywords", position)
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise MalformedModelOutputError(f"fragment {position}: keywords must be a list")
    out: dict[str, Keyword] = {}
    for item in value:
        if hasattr(item, "model_dump"):
            item = item.model_dump()
        if isinstance(item, str):
            said, general = item, []
        elif isinstance(item, Mapping):
            said = next((item[k] for k in ("said", "term", "keyword") if item.get(k)), "")
            general = _strings(item.get("general"), "keywords.general", position)
        else:
            continue
        said = " ".join(str(said).split())[:MAX_ENRICHMENT_CHARS] if said else ""
        if said and said.casefold() not in out:
            out[said.casefold()] = Keyword(said=said, general=general)
    return list(out.values())[:MAX_ENRICHMENT_ITEMS]


def _merge_overflow(drafts: list[FragmentDraft], limit: int) -> list[FragmentDraft]:
    """Fold drafts beyond `limit` into the last kept one, so nothing the model sliced is lost."""
    if len(drafts) <= limit:
        return drafts
    kept, extra = drafts[: limit - 1], drafts[limit - 1 :]
    types: list[str] = []
    for draft in extra:
        types.extend(t for t in draft.types if t not in types)
    merged = FragmentDraft(
        theme=extra[0].theme,
        types=types,
        content="\n".join(d.content for d in extra),
        start_idx=min(d.start_idx for d in extra),
        end_idx=max(d.end_idx for d in extra),
        facts=[f for d in extra for f in d.facts],
        entities=list(dict.fromkeys(e for d in extra for e in d.entities)),
        keywords=[k for d in extra for k in d.keywords],
    )
    return [*kept, merged]


def validate_drafts(
    raw: object, n_turns: int, max_fragments: int | None = None
) -> list[FragmentDraft]:
    """Trusted drafts from a slicer's raw answer.

    Repaired: unknown types dropped (none left -> chat), indexes clamped into [0, n_turns-1] and
    swapped when reversed, themes trimmed (blank -> "general"), drafts beyond `max_fragments`
    folded into the last one; the enrichment (facts, entities, keywords: optional) bounded,
    with items that are not text dropped (`_strings`, `_keywords`). Dropped: drafts with empty
    content. Raised as MalformedModelOutputError: anything without the shape of a list of
    fragment objects.
    """
    if n_turns < 1:
        raise InvalidInputError("cannot validate fragment drafts for zero turns")
    if isinstance(raw, Mapping) and "fragments" in raw:
        raw = raw["fragments"]  # tolerate the wrapper object the tool schema uses
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise MalformedModelOutputError(
            f"slicer output must be a list of fragments, got {type(raw).__name__}"
        )
    drafts: list[FragmentDraft] = []
    for position, item in enumerate(raw):
        if hasattr(item, "model_dump"):
            item = item.model_dump()
        if not isinstance(item, Mapping):
            raise MalformedModelOutputError(
                f"fragment {position} must be an object, got {type(item).__name__}"
            )
        content = _text(item, "content", position)
        if not content:
            continue
        for key in ("start_idx", "end_idx"):
            if key not in item:
                raise MalformedModelOutputError(f"fragment {position} has no {key}")
        start = min(max(_index(item["start_idx"], "start_idx", position), 0), n_turns - 1)
        end = min(max(_index(item["end_idx"], "end_idx", position), 0), n_turns - 1)
        if start > end:
            start, end = end, start
        theme = _text(item, "theme", position)[:MAX_THEME_CHARS].strip() or FALLBACK_THEME
        drafts.append(
            FragmentDraft(
                theme=theme,
                types=_types(item.get("types", []), position),
                content=content,
                start_idx=start,
                end_idx=end,
                facts=_strings(item.get("facts"), "facts", position),
                entities=_strings(item.get("entities"), "entities", position),
                keywords=_keywords(item.get("keywords"), position),
            )
        )
    if max_fragments is not None and max_fragments >= 1:
        drafts = _merge_overflow(drafts, max_fragments)
    return drafts


_LABEL_BRACKETS = str.maketrans("()\n", "[] ")


def speaker_label(turn: ChatTurn) -> str:
    """`User`, `Assistant`, or `User (Ada)`: how a fragment line names its speaker. Brackets in
    a name ("Jamie (she/her)") would end the label early, so they become square ones."""
    role = "User" if turn.role == "human" else "Assistant"
    name = " ".join((turn.name or "").translate(_LABEL_BRACKETS).split())[:60]
    return f"{role} ({name})" if name else role


def with_every_turn(
    drafts: list[FragmentDraft],
    turns: Sequence[ChatTurn],
    max_fragments: int | None,
) -> list[FragmentDraft]:
    """The drafts, plus, verbatim, every sentence of the human's and the assistant's turns that
    no draft quotes (a model asked to quote may still paraphrase or skip a turn it found
    unimportant: nothing said may exist only as a paraphrase, or not at all). A left-out
    sentence joins the draft whose turns cover it; sentences no draft covers make drafts of
    their own, in order, about MAX_KEPT_TURN_TOKENS each. Tool and system turns stay out, as
    in the offline slicer.
    """
    raw = "\n".join(d.content for d in drafts)
    quoted = normalise(raw)
    extra: dict[int, list[str]] = {}
    for idx, turn in enumerate(turns):
        text = turn.content.strip()
        if not text or turn.role not in ("human", "ai"):
            continue
        missing = [s for s in split_sentences(text) if _unquoted(s, quoted, raw)]
        if missing:
            extra[idx] = missing
    if not extra:
        return drafts
    out = [d.model_copy() for d in drafts]
    loose: list[tuple[int, str]] = []
    for idx, missing in extra.items():
        line = f"{speaker_label(turns[idx])}: {' '.join(missing)}"
        home = next((d for d in out if d.start_idx <= idx <= d.end_idx), None)
        if home is not None:
            home.content = f"{home.content}\n{line}"
        else:
            loose.append((idx, line))
    group: list[tuple[int, str]] = []
    for item in loose:
        if group and (
            item[0] != group[-1][0] + 1
            or estimate_tokens("\n".join(line for _, line in group) + item[1])
            > MAX_KEPT_TURN_TOKENS
        ):
            out.append(_kept_draft(group, out))
            group = []
        group.append(item)
    if group:
        out.append(_kept_draft(group, out))
    out.sort(key=lambda d: d.start_idx)
    if max_fragments is not None and max_fragments >= 1:
        out = _merge_overflow(out, max_fragments)
    return out


def _unquoted(sentence: str, quoted: str, raw: str) -> bool:
    """Whether no draft quotes the sentence: compared normalised, or, for a sentence of only
    emoji or punctuation (which normalises to nothing: "🎂🎉", "???"), as it was said."""
    norm = normalise(sentence)
    if norm:
        return norm not in quoted
    said = sentence.strip()
    return bool(said) and said not in raw


def _kept_draft(group: list[tuple[int, str]], drafts: list[FragmentDraft]) -> FragmentDraft:
    """A draft of left-out turns, themed like the draft said just before them."""
    first = group[0][0]
    before = [d for d in drafts if d.end_idx < first]
    near = max(before, key=lambda d: d.end_idx) if before else None
    return FragmentDraft(
        theme=near.theme if near else FALLBACK_THEME,
        types=list(near.types) if near else list(FALLBACK_TYPES),
        content="\n".join(line for _, line in group),
        start_idx=first,
        end_idx=group[-1][0],
    )


def within_bytes(
    drafts: list[FragmentDraft], limit: int = MAX_FRAGMENT_BYTES
) -> list[FragmentDraft]:
    """The drafts, each longer than `limit` UTF-8 bytes cut into consecutive drafts that fit
    (between lines, else between characters), with its theme, types and turns; nothing is
    dropped. Their number may pass `max_fragments`: a bound on count must not cost content."""
    out: list[FragmentDraft] = []
    for draft in drafts:
        if len(draft.content.encode("utf-8")) <= limit:
            out.append(draft)
            continue
        out.extend(
            draft.model_copy(update={"content": part}) for part in _byte_parts(draft.content, limit)
        )
    return out


def _byte_parts(text: str, limit: int) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.split("\n"):
        pieces = [line] if len(line.encode("utf-8")) <= limit else _char_parts(line, limit)
        for piece in pieces:
            cost = len(piece.encode("utf-8")) + (1 if current else 0)
            if current and size + cost > limit:
                parts.append("\n".join(current))
                current, size = [], 0
                cost = len(piece.encode("utf-8"))
            current.append(piece)
            size += cost
    if current:
        parts.append("\n".join(current))
    return [p for p in parts if p.strip()]


_LABEL = re.compile(r"^(?:User|Assistant)(?: \([^)\n]*\))?: ")


def _char_parts(line: str, limit: int) -> list[str]:
    """Pieces of one over-long line, each within `limit` bytes: cut at a sentence end or a
    space where one is near, and each piece keeps the line's speaker label, so every fragment
    says who said it (the repeat filter reads a line without one as the assistant's)."""
    label_match = _LABEL.match(line)
    label = label_match.group(0) if label_match else ""
    body = line[len(label) :]
    room = limit - len(label.encode("utf-8"))
    parts: list[str] = []
    start = 0
    while start < len(body):
        end, size = start, 0
        while end < len(body) and size + len(body[end].encode("utf-8")) <= room:
            size += len(body[end].encode("utf-8"))
            end += 1
        end = cut_point(body, start, end)
        parts.append(label + body[start:end])
        start = end
    return parts
