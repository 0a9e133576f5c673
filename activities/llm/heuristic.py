"""HeuristicMemoryModels: deterministic, offline stand-ins for the three memory LLM calls.

Used by the demo and the tests so that everything runs without a network or an API key. They are
heuristics and say so: the model name is "heuristic-offline", and the token counts they report are
estimates (`memory.text.estimate_tokens`, which counts CJK characters apart) of what an LLM
call of the same size would have cost (so the cost ledger has numbers to show). `latency_s`
simulates a slow LLM (the predecessor measured 800 ms per call).
"""

from __future__ import annotations

import asyncio
import heapq
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mnemoflow.activities.llm.base import InductedProfile, SlicedDrafts, TunedRaw, speaker_label
from mnemoflow.activities.llm.enrichment import heuristic_enrichment
from mnemoflow.activities.llm.heuristic_profile import extract_profile
from mnemoflow.activities.llm.heuristic_rules import (
    GENERAL,
    Theme,
    bounded_pieces,
    is_question,
    split_sentences,
    theme_label_repeats,
    themes_of,
    types_of,
    types_of_repeats,
)
from mnemoflow.memory.text import WINDOW_CHARS_PER_TOKEN, estimate_tokens, token_units
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn
from mnemoflow.models.usage import LLMUsage

HEURISTIC_MODEL_NAME = "heuristic-offline"
#: Upper bound of one fragment, in estimated tokens: small enough that a question's evidence
#: comes with little else, so a 1,200-token memory budget holds many of them.
MAX_FRAGMENT_TOKENS = 160
#: `estimate_tokens` is `token_units` over this, rounded up.
_UNITS_PER_TOKEN = round(WINDOW_CHARS_PER_TOKEN * 10)


@dataclass
class _Group:
    """Consecutive whole turns, with the turns they came from and their themes' votes."""

    theme: Theme
    lines: list[str] = field(default_factory=list)
    #: What the human turns state, as (text, count) runs: every piece of a long turn carries
    #: its turn's text, and the runs keep that without holding (or searching) each copy.
    human: list[tuple[str, int]] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)
    tokens: int = 0
    votes: list[Theme] = field(default_factory=list)

    def vote(self, theme: Theme) -> None:
        """Count a human turn's theme; the group's theme is the most voted specific one."""
        if theme is not GENERAL:
            self.votes.append(theme)
            self.theme = _dominant(self.votes)

    def add(self, line: str, idx: int, human: str = "") -> None:
        self.lines.append(line)
        self.indexes.append(idx)
        self.tokens += estimate_tokens(line)
        if human:
            self.state(human, 1)

    def state(self, human: str, count: int) -> None:
        if self.human and self.human[-1][0] == human:
            count += self.human[-1][1]
            self.human.pop()
        self.human.append((human, count))


def _pieces(turn: ChatTurn, text: str) -> list[str]:
    """The turn as `Speaker: text` lines, verbatim; a turn over the fragment bound is cut at
    sentence ends, and a sentence over it between words, a word between characters (each piece
    still verbatim and attributed)."""
    speaker = speaker_label(turn)
    if estimate_tokens(text) <= MAX_FRAGMENT_TOKENS:
        return [f"{speaker}: {text}"]
    pieces = bounded_pieces(text, MAX_FRAGMENT_TOKENS, token_units, _UNITS_PER_TOKEN)
    return [f"{speaker}: {p}" for p in pieces]


def _dominant(themes: list[Theme]) -> Theme:
    """The most frequent specific theme of a turn's sentences (first seen on ties)."""
    specific = [t for t in themes if t is not GENERAL]
    if not specific:
        return GENERAL
    counts = Counter(t.key for t in specific)
    return max(specific, key=lambda t: (counts[t.key], -specific.index(t)))


def _usage(prompt: str, answer: Any) -> LLMUsage:
    """What an LLM call of this size would have reported (estimated, never measured)."""
    tokens_in = estimate_tokens(prompt)
    return LLMUsage(
        calls=1,
        input_tokens=tokens_in,
        output_tokens=estimate_tokens(json.dumps(answer, ensure_ascii=False, default=str)),
        cache_miss_tokens=tokens_in,
    )


class HeuristicMemoryModels:
    """Keyword-and-regex memory models: deterministic, offline, English and Chinese."""

    def __init__(self, *, latency_s: float = 0.0, calls: Counter[str] | None = None) -> None:
        if latency_s < 0:
            raise ValueError("latency_s must be >= 0")
        self.name = HEURISTIC_MODEL_NAME
        self.latency_s = latency_s
        #: Calls per operation; pass your own Counter to observe calls from outside.
        self.calls: Counter[str] = calls if calls is not None else Counter()

    async def _call(self, operation: str) -> None:
        self.calls[operation] += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)  # simulated LLM latency, not synchronisation

    async def slice(self, turns: list[ChatTurn], max_fragments: int) -> SlicedDrafts:
        """Consecutive whole turns, verbatim with their speaker, up to MAX_FRAGMENT_TOKENS
        (estimated) a fragment, labelled with the keyword theme of their human turns. Tool and
        system turns are left out. Fragments follow the conversation rather than gather a theme
        from all over it: a question's evidence is a turn and the turns next to it, and the
        per-call search injects a matching line with its neighbours (memory.search)."""
        await self._call("slice")
        chunks: list[_Group] = [_Group(GENERAL)]
        for idx, turn in enumerate(turns):
            text = turn.content.strip()
            if not text or turn.role in ("system", "tool"):
                continue
            theme = GENERAL
            if turn.role == "human":
                theme = _dominant(themes_of(split_sentences(text)))
            # Types come from what the human states: a question is stored, never as a fact.
            stated = " ".join(s for s in split_sentences(text) if not is_question(s))
            for line in _pieces(turn, text):
                cost = estimate_tokens(line)
                if chunks[-1].lines and chunks[-1].tokens + cost > MAX_FRAGMENT_TOKENS:
                    chunks.append(_Group(GENERAL))
                chunks[-1].add(line, idx, stated if turn.role == "human" else "")
                chunks[-1].vote(theme)
        chunks = [c for c in chunks if c.lines]
        drafts = [self._draft(g) for g in self._bounded(chunks, max_fragments)]
        prompt = "\n".join(f"[{i}] {t.role}: {t.content}" for i, t in enumerate(turns))
        return SlicedDrafts(drafts=drafts, usage=_usage(prompt, drafts))

    @staticmethod
    def _bounded(groups: list[_Group], limit: int) -> list[_Group]:
        """At most `limit` groups: the neighbouring pair (in conversation order) that is
        smallest together is merged until they fit (the earliest such pair on ties); nothing is
        dropped. The pairs wait in a heap keyed (size, position), an entry going stale when
        either group changes, so n groups take n log n rather than a scan of all pairs per merge
        (quadratic: a round of long turns is thousands of groups)."""
        groups.sort(key=lambda g: g.indexes[0])
        count = len(groups)
        target = max(1, limit)
        if count <= target:
            return groups
        after = list(range(1, count + 1))  # the next live group (count: none)
        before = list(range(-1, count - 1))
        alive = [True] * count
        version = [0] * count  # bumped when a group takes in its neighbour

        def pair(left: int) -> tuple[int, int, int, int, int]:
            right = after[left]
            size = groups[left].tokens + groups[right].tokens
            return (size, left, right, version[left], version[right])

        heap = [pair(k) for k in range(count - 1)]
        heapq.heapify(heap)
        while count > target:
            _, left, right, left_version, right_version = heapq.heappop(heap)
            if not (
                alive[left]
                and alive[right]
                and after[left] == right
                and version[left] == left_version
                and version[right] == right_version
            ):
                continue
            first, second = groups[left], groups[right]
            if first.theme is GENERAL and second.theme is not GENERAL:
                first.theme = second.theme
            first.lines.extend(second.lines)
            for text, times in second.human:
                first.state(text, times)
            first.votes.extend(second.votes)
            first.indexes.extend(second.indexes)
            first.tokens += second.tokens
            alive[right] = False
            version[left] += 1
            after[left] = after[right]
            if after[left] < len(groups):
                before[after[left]] = left
                heapq.heappush(heap, pair(left))
            if before[left] >= 0:
                heapq.heappush(heap, pair(before[left]))
            count -= 1
        return [g for g, live in zip(groups, alive, strict=True) if live]

    @staticmethod
    def _draft(group: _Group) -> dict[str, Any]:
        content = "\n".join(group.lines)
        return {
            "theme": theme_label_repeats(group.theme, group.human),
            "types": types_of_repeats(group.human) if group.human else ["chat"],
            "content": content,
            "start_idx": min(group.indexes),
            "end_idx": max(group.indexes),
            # what can be found without a model: names, numbers, general terms
            **heuristic_enrichment(content),
        }

    async def tune(self, theme: str, samples: list[str], types: list[str]) -> TunedRaw:
        """Weights from the theme's type mix: identity/preference-heavy themes lean on gamma
        (importance), episode/chat-heavy ones on beta (recency), the rest on alpha (relevance)."""
        await self._call("tune")
        mix: Counter[str] = Counter(t for t in types if isinstance(t, str))
        for sample in samples:
            mix.update(types_of(sample))
        total = sum(mix.values()) or 1
        lasting = (mix["identity"] + mix["preference"]) / total
        fleeting = (mix["episode"] + mix["chat"]) / total
        decided = mix["decision"] / total
        gamma = 0.25 + 0.35 * lasting
        beta = 0.15 + 0.35 * fleeting
        params = {
            "alpha": round(1.0 - gamma - beta, 4),
            "beta": round(beta, 4),
            "gamma": round(gamma, 4),
            "delta": round(0.05 * lasting - 0.05 * fleeting, 4),
            "w0": round(0.1 - 0.05 * lasting, 4),
            "w1": round(0.75 + 0.15 * lasting - 0.1 * decided, 4),
            "w2": round(0.15 - 0.1 * lasting + 0.1 * decided, 4),
        }
        prompt = json.dumps({"theme": theme, "samples": samples, "types": types})
        return TunedRaw(params=params, usage=_usage(prompt, params))

    async def induct(self, profile: UserProfile, fragments: list[Fragment]) -> InductedProfile:
        """A profile update from what the fragments' human lines state (regex extraction)."""
        await self._call("induct")
        update = extract_profile(f.content for f in fragments)
        prompt = profile.model_dump_json() + "".join(f.content for f in fragments)
        return InductedProfile(update=update, usage=_usage(prompt, update.model_dump()))
