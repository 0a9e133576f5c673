"""Query-time re-ranking of published fragments, with no I/O (the hot path may not do any).

Rounds select fragments for the conversation as it was when the round ran; the next question
may be about something else. The read model carries more ranked candidates than seats, and the
middleware re-orders them by how much of the latest human message each one covers.
"""

from __future__ import annotations

from collections.abc import Sequence

from mnemoflow.memory.text import (
    QUESTION_TOKENS,
    content_tokens,
    normalise,
    overlap,
    wanted_tokens,
)
from mnemoflow.models.contracts import ContextFragment

#: How much full coverage of the query is worth, in units of the published score.
QUERY_WEIGHT = 1.0


def rerank_for_query(
    fragments: Sequence[ContextFragment], query: str, weight: float = QUERY_WEIGHT
) -> list[ContextFragment]:
    """Published score plus weight * query overlap, best first; ties keep the published order."""
    if not query.strip() or weight <= 0:
        return list(fragments)
    wanted = wanted_tokens(query)
    keyed = [
        (-(f.score + weight * overlap(wanted, f"{f.theme} {f.content}")), i, f)
        for i, f in enumerate(fragments)
    ]
    return [f for _, _, f in sorted(keyed, key=lambda k: (k[0], k[1]))]


#: Share of an answer's content tokens a fragment must hold for the answer to count as drawing
#: on it (a generic reply such as "Let me check." draws on nothing).
USE_THRESHOLD = 0.5
#: Content tokens of the answer a fragment must hold at least: a short generic reply ("I will
#: check my notes.") shares half its few words with many fragments by chance.
MIN_USED_TOKENS = 3
#: Fragments one model call may reinforce at most: reinforcement stays a small, bounded signal.
MAX_REINFORCED = 3


def drawn_on(
    answer: str, fragments: Sequence[ContextFragment], threshold: float = USE_THRESHOLD
) -> list[ContextFragment]:
    """The injected fragments the answer evidently used, best covered first, at most
    MAX_REINFORCED: reinforcement follows evidence of use, not injection."""
    if not answer.strip():
        return []
    size = len(content_tokens(normalise(answer)) - QUESTION_TOKENS)
    wanted = wanted_tokens(answer)  # the answer's tokens once, not once per fragment
    scored = [(overlap(wanted, f.content), i, f) for i, f in enumerate(fragments)]
    used = sorted(
        (s for s in scored if s[0] >= threshold and s[0] * size >= MIN_USED_TOKENS - 1e-9),
        key=lambda s: (-s[0], s[1]),
    )
    return [f for _, _, f in used[:MAX_REINFORCED]]
