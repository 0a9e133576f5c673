"""HeuristicMemoryModels: deterministic, offline stand-ins for the three memory LLM calls.

Used by the demo and the tests so that everything runs without a network or an API key. They are
heuristics and say so: the model name is "heuristic-offline", and the token counts they report are
estimates (`memory.triggers.estimate_tokens`, which counts CJK characters apart) of what an LLM
call of the same size would have cost (so the cost ledger has numbers to show). `latency_s`
simulates a slow LLM (the predecessor measured 800 ms per call).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mnemoflow.activities.llm.base import InductedProfile, SlicedDrafts, TunedRaw
from mnemoflow.activities.llm.heuristic_profile import extract_profile
from mnemoflow.activities.llm.heuristic_rules import (
    GENERAL,
    Theme,
    join_sentences,
    split_sentences,
    theme_label,
    themes_of,
    types_of,
)
from mnemoflow.memory.triggers import estimate_tokens
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn
from mnemoflow.models.usage import LLMUsage

HEURISTIC_MODEL_NAME = "heuristic-offline"
#: Assistant lines longer than this are explanations, not memory; short ones ("Noted: order
#: 88231") often confirm a detail and are kept.
MAX_ASSISTANT_CHARS = 160


@dataclass
class _Group:
    """Sentences of one theme, in conversation order, with the turns they came from."""

    theme: Theme
    lines: list[str] = field(default_factory=list)
    human_text: list[str] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)


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
        """Group the human's sentences by keyword theme; keep short assistant confirmations."""
        await self._call("slice")
        groups: dict[str, _Group] = {}
        last_theme: Theme | None = None
        for idx, turn in enumerate(turns):
            text = turn.content.strip()
            if not text or turn.role in ("system", "tool"):
                continue
            if turn.role == "ai":
                # An assistant line belongs with what the human just said, if it is short.
                if len(text) <= MAX_ASSISTANT_CHARS and last_theme is not None:
                    group = groups[last_theme.key]
                    group.lines.append(f"Assistant: {text}")
                    group.indexes.append(idx)
                continue
            turn_themes: list[Theme] = []
            sentences = split_sentences(text)
            for sentence, theme in zip(sentences, themes_of(sentences), strict=True):
                group = groups.setdefault(theme.key, _Group(theme))
                if theme not in turn_themes:
                    turn_themes.append(theme)
                    group.lines.append(f"User: {sentence}")
                    group.indexes.append(idx)
                else:
                    group.lines[-1] = join_sentences(group.lines[-1], sentence)
                group.human_text.append(sentence)
            last_theme = turn_themes[0] if turn_themes else last_theme
        drafts = [self._draft(g) for g in self._bounded(list(groups.values()), max_fragments)]
        prompt = "\n".join(f"[{i}] {t.role}: {t.content}" for i, t in enumerate(turns))
        return SlicedDrafts(drafts=drafts, usage=_usage(prompt, drafts))

    @staticmethod
    def _bounded(groups: list[_Group], limit: int) -> list[_Group]:
        """At most `limit` groups: the smallest ones are folded into the general theme."""
        groups.sort(key=lambda g: g.indexes[0])
        while len(groups) > max(1, limit):
            smallest = min(groups, key=lambda g: (len(g.human_text), -g.indexes[0]))
            groups.remove(smallest)
            target = next((g for g in groups if g.theme is GENERAL), None)
            if target is None:
                target = min(groups, key=lambda g: len(g.human_text))
            target.lines.extend(smallest.lines)
            target.human_text.extend(smallest.human_text)
            target.indexes.extend(smallest.indexes)
        return groups

    @staticmethod
    def _draft(group: _Group) -> dict[str, Any]:
        human = " ".join(group.human_text)
        return {
            "theme": theme_label(group.theme, human),
            "types": types_of(human) if human else ["chat"],
            "content": "\n".join(group.lines),
            "start_idx": min(group.indexes),
            "end_idx": max(group.indexes),
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
