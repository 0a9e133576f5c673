"""The memory-model formulas (docs/ARCHITECTURE.md) against hand-computed values."""

import math

import pytest

from mnemoflow.memory.formulas import (
    importance,
    maturity,
    relevance,
    score,
    time_decay,
    time_to_maturity,
    type_union,
)
from mnemoflow.models.config import PRESETS, Vocation

CS = PRESETS[Vocation.CUSTOMER_SERVICE]


def test_maturity_at_tau_m_is_one_minus_inverse_e():
    assert maturity(600, CS.tau_m, CS.c_m) == pytest.approx(1 - math.exp(-1))
    assert maturity(600, CS.tau_m, CS.c_m) == pytest.approx(0.632, abs=5e-4)


def test_maturity_of_a_brand_new_or_future_message_is_zero():
    assert maturity(0, CS.tau_m, CS.c_m) == 0.0
    assert maturity(-30, CS.tau_m, CS.c_m) == 0.0  # clock skew never makes it "more than new"


def test_slice_gate_is_reached_at_about_870_seconds():
    dt = time_to_maturity(CS.slice_gate, CS.tau_m, CS.c_m)
    assert dt == pytest.approx(600 * math.log(1 / 0.3) ** 2)
    assert dt == pytest.approx(869.8, abs=0.1)
    assert maturity(dt, CS.tau_m, CS.c_m) == pytest.approx(0.7)


def test_long_term_gate_is_reached_at_about_3180_seconds():
    dt = time_to_maturity(CS.long_term_gate, CS.tau_m, CS.c_m)
    assert dt == pytest.approx(600 * math.log(10) ** 2)
    assert dt == pytest.approx(3181.1, abs=0.1)


def test_slice_gate_falls_between_14_and_15_minutes():
    assert maturity(14 * 60, CS.tau_m, CS.c_m) < CS.slice_gate
    assert maturity(15 * 60, CS.tau_m, CS.c_m) >= CS.slice_gate


@pytest.mark.parametrize("v", [-0.1, 1.0, 1.5])
def test_time_to_maturity_rejects_levels_outside_0_1(v):
    with pytest.raises(ValueError):
        time_to_maturity(v, 600, 0.5)


def test_time_to_maturity_of_zero_is_zero():
    assert time_to_maturity(0.0, 600, 0.5) == 0.0


def test_time_decay_hand_values():
    assert time_decay(0, 43200, 0.5) == 1.0
    assert time_decay(-5, 43200, 0.5) == 1.0
    assert time_decay(43200, 43200, 0.5) == pytest.approx(math.exp(-1))
    # 4 * tau with c = .5: exp(-sqrt(4)) = exp(-2)
    assert time_decay(4 * 43200, 43200, 0.5) == pytest.approx(math.exp(-2))


def test_type_union_hand_values():
    assert type_union(["identity", "preference"]) == pytest.approx(1 - 0.05 * 0.2)
    assert type_union(["identity", "preference"]) == pytest.approx(0.99)
    assert type_union(["fact"]) == pytest.approx(0.60)
    assert type_union(["episode", "chat"]) == pytest.approx(1 - 0.6 * 0.85)


def test_type_union_ignores_unknown_and_repeated_types():
    assert type_union([]) == 0.0
    assert type_union(["gossip"]) == 0.0
    assert type_union(["fact", "fact", "gossip"]) == pytest.approx(0.60)


def test_importance_hand_value():
    # w = .1/.8/.1, u(fact) = .6, n = 2: .1 + .48 + .1 * (1 - e^-1)
    expected = 0.1 + 0.8 * 0.6 + 0.1 * (1 - math.exp(-1))
    assert importance(["fact"], 2, 0.1, 0.8, 0.1) == pytest.approx(expected)


def test_importance_is_clamped_to_0_1():
    assert importance(["identity"], 50, 0.5, 1.0, 1.0) == 1.0
    assert importance(["chat"], 0, -2.0, 0.1, 0.0) == 0.0


def test_importance_treats_negative_count_as_zero():
    assert importance(["fact"], -3, 0.1, 0.8, 0.1) == pytest.approx(0.1 + 0.48)


def test_relevance_odd_count_uses_middle_value():
    # median .5, max .9: (.9-.5)/.4 = 1, (.7-.5)/.4 = .5, below the median -> 0
    assert relevance([0.1, 0.5, 0.9, 0.7, 0.3]) == pytest.approx([0, 0, 1, 0.5, 0])


def test_relevance_even_count_uses_mean_of_middle_values():
    # sorted .2 .4 .6 1.0: median .5, span .5
    assert relevance([0.6, 0.2, 1.0, 0.4]) == pytest.approx([0.2, 0, 1, 0])


def test_relevance_all_equal_is_all_zero():
    assert relevance([0.42, 0.42, 0.42]) == [0.0, 0.0, 0.0]
    assert relevance([0.8]) == [0.0]


def test_relevance_below_median_and_negative_cosines_are_zero():
    assert relevance([-0.5, -0.1, 0.3]) == pytest.approx([0, 0, 1])


def test_relevance_of_no_candidates_is_empty():
    assert relevance([]) == []


def test_score_is_the_weighted_sum():
    assert score(1.0, 0.5, 0.25, 0.5, 0.3, 0.2, 0.05) == pytest.approx(0.5 + 0.15 + 0.05 + 0.05)
