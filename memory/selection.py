"""Selection: score a user's candidate fragments and pick the ones injected (docs/ARCHITECTURE.md).

Seats are filled in three passes, each in score order (ties broken by fragment id, so a replayed
selection is identical): fragments of `always_inject_types` first ("type floor"), then the rest
("score"), both under the optional per-theme cap; if the cap left seats empty they are refilled
with the best remaining fragments regardless of it ("refill"), because an empty seat helps nobody.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from mnemoflow.memory.formulas import importance, relevance, score, time_decay
from mnemoflow.memory.params import renormalise
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.fragments import Candidate, ScoredCandidate, SelectionLog, theme_key
from mnemoflow.models.params import TunedParams

__all__ = ["Selection", "select"]

REASON_FLOOR = "type floor"
REASON_SCORE = "score"
REASON_REFILL = "refill"
REASON_CAPPED = "theme cap"
REASON_NOT_PICKED = "not picked"


class Selection(BaseModel):
    """The outcome of one selection: ranked fragments (picked first), their ids, and the log."""

    ranked: list[ContextFragment] = Field(default_factory=list)
    picked_ids: list[str] = Field(default_factory=list)
    log: SelectionLog


def _dedupe(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per fragment id (the highest cos), in first-seen order."""
    best: dict[str, Candidate] = {}
    for cand in candidates:
        seen = best.get(cand.fragment.id)
        if seen is None or cand.cos > seen.cos:
            best[cand.fragment.id] = cand
    return list(best.values())


def _score_lines(
    candidates: list[Candidate], params: TunedParams, config: MemoryConfig, now: float
) -> list[ScoredCandidate]:
    """Every term of the formula for every candidate, in candidate order."""
    rs = relevance([c.cos for c in candidates])
    lines = []
    for cand, r in zip(candidates, rs, strict=True):
        frag = cand.fragment
        t = time_decay(now - max(frag.created_at, frag.reinforced_at), config.tau, config.c)
        f = importance(frag.types, frag.strengthen_count, params.w0, params.w1, params.w2)
        s = score(r, t, f, params.alpha, params.beta, params.gamma, params.delta)
        lines.append(
            ScoredCandidate(
                fragment_id=frag.id,
                theme=frag.theme,
                types=list(frag.types),
                cos=cand.cos,
                R=r,
                T=t,
                F=f,
                alpha_R=params.alpha * r,
                beta_T=params.beta * t,
                gamma_F=params.gamma * f,
                delta=params.delta,
                score=s,
                picked=False,
                reason=REASON_NOT_PICKED,
            )
        )
    return lines


def _pick(lines: list[ScoredCandidate], config: MemoryConfig) -> list[ScoredCandidate]:
    """Mark the picked lines (and why) in place; return them in pick order."""
    floor_types = set(config.always_inject_types)
    cap = config.theme_cap
    per_theme: dict[str, int] = {}
    picked: list[ScoredCandidate] = []

    def take(line: ScoredCandidate, reason: str) -> None:
        line.picked, line.reason = True, reason
        picked.append(line)
        key = theme_key(line.theme)
        per_theme[key] = per_theme.get(key, 0) + 1

    def capped_pass(pool: list[ScoredCandidate], reason: str) -> None:
        for line in pool:
            if len(picked) >= config.top_k:
                return
            if line.picked:
                continue
            if cap is not None and per_theme.get(theme_key(line.theme), 0) >= cap:
                line.reason = REASON_CAPPED
                continue
            take(line, reason)

    capped_pass([ln for ln in lines if floor_types.intersection(ln.types)], REASON_FLOOR)
    capped_pass(lines, REASON_SCORE)
    for line in lines:  # the cap left seats empty: the best remaining, cap or not
        if len(picked) >= config.top_k:
            break
        if not line.picked:
            take(line, REASON_REFILL)
    return picked


def select(
    candidates: Sequence[Candidate],
    params: TunedParams,
    config: MemoryConfig,
    now: float,
    theme: str = "",
    params_source: str = "default",
) -> Selection:
    """Score every candidate, pick up to `config.top_k`, and log every candidate's terms.

    `ranked` holds the picked fragments in pick order, then the others by score, up to
    `config.published_candidates` in all (never fewer than the picked ones), so the hot path can
    skip a fragment still in its window and fall back to the next. The log lists candidates by
    score. Params are renormalised again: a TunedParams can be built with anything.
    """
    params = renormalise(params)
    unique = _dedupe(candidates)
    lines = _score_lines(unique, params, config, now)
    by_id = {c.fragment.id: c.fragment for c in unique}
    lines.sort(key=lambda ln: (-ln.score, ln.fragment_id))
    picked = _pick(lines, config)

    rest = [ln for ln in lines if not ln.picked]
    size = max(config.published_candidates, len(picked))
    ranked = [
        ContextFragment.of(by_id[line.fragment_id], line.score) for line in [*picked, *rest][:size]
    ]
    log = SelectionLog(at=now, theme=theme, params_source=params_source, candidates=lines)
    return Selection(ranked=ranked, picked_ids=[ln.fragment_id for ln in picked], log=log)
