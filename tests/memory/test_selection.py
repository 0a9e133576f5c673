"""Selection: scoring by hand, type floor, theme cap and refill, ties, the scoring log."""

import math
import random

import pytest

from mnemoflow.memory.selection import select
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.fragments import Candidate, Fragment
from mnemoflow.models.params import TunedParams

NOW = 1_000_000.0
PARAMS = TunedParams(alpha=0.5, beta=0.25, gamma=0.25, delta=0.0, w0=0.1, w1=0.8, w2=0.1)


def cand(
    fid: str,
    cos: float,
    types: tuple[str, ...] = ("fact",),
    theme: str = "misc",
    age: float = 0.0,
    reinforced_age: float | None = None,
    count: int = 0,
) -> Candidate:
    created = NOW - age
    reinforced = created if reinforced_age is None else NOW - reinforced_age
    frag = Fragment(
        id=fid,
        user_id="u",
        theme=theme,
        types=list(types),
        content=f"content of {fid}",
        created_at=created,
        reinforced_at=reinforced,
        strengthen_count=count,
        thread_id="t1",
        start_pos=2,
        end_pos=5,
    )
    return Candidate(fragment=frag, cos=cos)


def config(**overrides: object) -> MemoryConfig:
    return MemoryConfig.model_validate(overrides)


def reasons(selection) -> dict[str, str]:
    return {line.fragment_id: line.reason for line in selection.log.candidates}


def test_hand_computed_scores_and_order():
    cands = [cand("a", 0.9), cand("b", 0.5, ("chat",)), cand("c", 0.1, ("episode",))]
    sel = select(cands, PARAMS, config(), NOW)
    # R = 1, 0, 0 (median .5); T = 1 (age 0); F = .1 + .8u: .58, .22, .42
    by_id = {line.fragment_id: line for line in sel.log.candidates}
    assert (by_id["a"].R, by_id["a"].T, by_id["a"].F) == pytest.approx((1, 1, 0.58))
    assert by_id["a"].score == pytest.approx(0.5 + 0.25 + 0.25 * 0.58)
    assert by_id["b"].score == pytest.approx(0.25 + 0.25 * 0.22)
    assert by_id["c"].score == pytest.approx(0.25 + 0.25 * 0.42)
    assert sel.picked_ids == ["a", "c", "b"]
    assert [f.id for f in sel.ranked] == ["a", "c", "b"]
    assert all(line.reason == "score" and line.picked for line in sel.log.candidates)


def test_time_decay_uses_the_later_of_created_and_reinforced():
    old = cand("old", 0.5, age=43200)
    refreshed = cand("refreshed", 0.5, age=5 * 43200, reinforced_age=43200)
    never = cand("never", 0.5, age=4 * 43200)
    sel = select([old, refreshed, never], PARAMS, config(), NOW)
    by_id = {line.fragment_id: line for line in sel.log.candidates}
    assert by_id["old"].T == pytest.approx(math.exp(-1))
    assert by_id["refreshed"].T == pytest.approx(math.exp(-1))
    assert by_id["never"].T == pytest.approx(math.exp(-2))


def test_strengthen_count_raises_importance():
    sel = select([cand("a", 0.5, count=2)], PARAMS, config(), NOW)
    assert sel.log.candidates[0].F == pytest.approx(0.1 + 0.48 + 0.1 * (1 - math.exp(-1)))


def test_type_floor_takes_seats_first():
    cands = [
        cand("x", 0.9),
        cand("y", 0.8),
        cand("p", 0.1, ("preference",)),
    ]
    sel = select(cands, PARAMS, config(top_k=2), NOW)
    assert sel.picked_ids == ["p", "x"]
    assert [f.id for f in sel.ranked] == ["p", "x", "y"]
    assert reasons(sel) == {"p": "type floor", "x": "score", "y": "not picked"}


def test_type_floor_is_ordered_by_score_and_bounded_by_top_k():
    cands = [
        cand("i1", 0.2, ("identity",)),
        cand("i2", 0.6, ("identity",)),
        cand("f", 0.9),
        cand("g", 0.1),
        cand("h", 0.1),
    ]
    sel = select(cands, PARAMS, config(top_k=1), NOW)
    assert sel.log.candidates[0].fragment_id == "f"  # the best score, yet not a floor type
    assert sel.picked_ids == ["i2"]
    assert reasons(sel) == {
        "i2": "type floor",
        "i1": "not picked",
        "f": "not picked",
        "g": "not picked",
        "h": "not picked",
    }


def test_theme_cap_then_refill():
    cands = [
        cand("t1", 0.9, theme="travel"),
        cand("t2", 0.8, theme="Travel "),  # same theme for the cap: case and spaces ignored
        cand("t3", 0.7, theme="travel"),
        cand("f1", 0.1, theme="food"),
    ]
    sel = select(cands, PARAMS, config(top_k=3, theme_cap=1), NOW)
    assert sel.picked_ids == ["t1", "f1", "t2"]
    assert reasons(sel) == {"t1": "score", "f1": "score", "t2": "refill", "t3": "theme cap"}


def test_theme_cap_applies_to_type_floor_seats():
    cands = [
        cand("p1", 0.9, ("preference",), theme="food"),
        cand("p2", 0.8, ("preference",), theme="food"),
        cand("x", 0.1, theme="work"),
    ]
    sel = select(cands, PARAMS, config(top_k=2, theme_cap=1), NOW)
    assert sel.picked_ids == ["p1", "x"]
    assert reasons(sel)["p2"] == "theme cap"


def test_ties_break_by_fragment_id_whatever_the_input_order():
    cands = [cand(fid, 0.5) for fid in ("d", "b", "a", "c")]
    first = select(cands, PARAMS, config(top_k=2), NOW)
    assert first.picked_ids == ["a", "b"]
    for seed in range(5):
        shuffled = cands[:]
        random.Random(seed).shuffle(shuffled)
        again = select(shuffled, PARAMS, config(top_k=2), NOW)
        assert again == first


def test_log_has_every_candidate_with_contributions_summing_to_score():
    cands = [
        cand("a", 0.9, ("identity",), age=3600, count=1),
        cand("b", 0.4, ("chat", "fact"), age=86400),
        cand("c", 0.6, ("decision",), age=60),
        cand("d", -0.2, ("unknown",), age=10),
        cand("e", 0.7, ("episode",), age=600000, count=5),
    ]
    params = TunedParams(alpha=0.6, beta=0.1, gamma=0.3, delta=0.05, w0=0.2, w1=0.6, w2=0.2)
    sel = select(cands, params, config(top_k=2), NOW, theme="t", params_source="tuned")
    log = sel.log
    assert (log.at, log.theme, log.params_source) == (NOW, "t", "tuned")
    assert sorted(line.fragment_id for line in log.candidates) == ["a", "b", "c", "d", "e"]
    scores = [line.score for line in log.candidates]
    assert scores == sorted(scores, reverse=True)
    for line in log.candidates:
        assert line.alpha_R == pytest.approx(0.6 * line.R)
        assert line.beta_T == pytest.approx(0.1 * line.T)
        assert line.gamma_F == pytest.approx(0.3 * line.F)
        assert line.delta == pytest.approx(0.05)
        assert line.alpha_R + line.beta_T + line.gamma_F + line.delta == pytest.approx(line.score)
    assert sum(line.picked for line in log.candidates) == 2


def test_params_are_renormalised_before_scoring():
    raw = TunedParams(alpha=2, beta=0, gamma=0, delta=5)
    sel = select([cand("a", 0.9), cand("b", 0.1)], raw, config(), NOW)
    top = sel.log.candidates[0]
    assert top.score == pytest.approx(1.0 + 0.2)  # alpha -> 1, delta -> .2


def test_ranked_is_bounded_by_published_candidates_but_keeps_picks():
    cands = [cand(f"f{i}", i / 10) for i in range(6)]
    sel = select(cands, PARAMS, config(top_k=2, published_candidates=3), NOW)
    assert [f.id for f in sel.ranked] == ["f5", "f4", "f3"]
    sel = select(cands, PARAMS, config(top_k=2, published_candidates=1), NOW)
    assert [f.id for f in sel.ranked] == ["f5", "f4"]


def test_ranked_fragments_carry_their_source_and_score():
    sel = select([cand("a", 0.9)], PARAMS, config(), NOW)
    frag = sel.ranked[0]
    assert (frag.id, frag.theme, frag.types) == ("a", "misc", ["fact"])
    assert frag.content == "content of a"
    assert (frag.thread_id, frag.start_pos, frag.end_pos) == ("t1", 2, 5)
    assert frag.score == pytest.approx(sel.log.candidates[0].score)


def test_duplicate_candidates_are_scored_once_with_their_best_cosine():
    sel = select([cand("a", 0.2), cand("a", 0.9), cand("b", 0.5)], PARAMS, config(), NOW)
    assert [line.fragment_id for line in sel.log.candidates] == ["a", "b"]
    assert sel.log.candidates[0].cos == 0.9


def test_no_candidates_selects_nothing():
    sel = select([], PARAMS, config(), NOW)
    assert (sel.ranked, sel.picked_ids, sel.log.candidates) == ([], [], [])
