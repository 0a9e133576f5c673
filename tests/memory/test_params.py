"""Renormalisation of LLM-tuned parameters: anything in, valid parameters out."""

import math

import pytest

from mnemoflow.memory.params import DEFAULT_PARAMS, renormalise
from mnemoflow.models.params import TunedParams


def sums(p: TunedParams) -> tuple[float, float]:
    return p.alpha + p.beta + p.gamma, p.w0 + p.w1 + p.w2


def test_defaults_are_the_spec_values():
    assert DEFAULT_PARAMS == TunedParams(
        alpha=1 / 3, beta=1 / 3, gamma=1 / 3, delta=0.0, w0=0.1, w1=0.8, w2=0.1
    )


def test_valid_params_pass_through():
    p = renormalise({"alpha": 0.5, "beta": 0.3, "gamma": 0.2, "w0": 0.2, "w1": 0.6, "w2": 0.2})
    assert (p.alpha, p.beta, p.gamma) == pytest.approx((0.5, 0.3, 0.2))
    assert (p.w0, p.w1, p.w2) == pytest.approx((0.2, 0.6, 0.2))


def test_weights_are_rescaled_to_sum_to_one():
    p = renormalise({"alpha": 2, "beta": 1, "gamma": 1, "w0": 1, "w1": 2, "w2": 1})
    assert (p.alpha, p.beta, p.gamma) == pytest.approx((0.5, 0.25, 0.25))
    assert (p.w0, p.w1, p.w2) == pytest.approx((0.25, 0.5, 0.25))


def test_negative_weights_are_clipped_to_zero_before_rescaling():
    p = renormalise({"alpha": -1, "beta": 3, "gamma": 1, "w0": -0.5, "w1": 0.5, "w2": 0.5})
    assert (p.alpha, p.beta, p.gamma) == pytest.approx((0, 0.75, 0.25))
    assert (p.w0, p.w1, p.w2) == pytest.approx((0, 0.5, 0.5))


def test_all_zero_weights_fall_back_to_defaults():
    p = renormalise({"alpha": 0, "beta": 0, "gamma": -2, "w0": 0, "w1": 0, "w2": 0})
    assert (p.alpha, p.beta, p.gamma) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert (p.w0, p.w1, p.w2) == pytest.approx((0.1, 0.8, 0.1))


@pytest.mark.parametrize(
    ("raw", "expected"), [(0.5, 0.2), (-0.7, -0.1), (0.15, 0.15), (-0.05, -0.05)]
)
def test_delta_is_clipped(raw, expected):
    assert renormalise({"delta": raw}).delta == pytest.approx(expected)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "high", None, True, [0.5], {}])
def test_unusable_values_count_as_missing(bad):
    p = renormalise({"alpha": bad, "beta": 1 / 3, "gamma": 1 / 3, "delta": bad, "w1": bad})
    assert p.alpha == pytest.approx(1 / 3)  # the default, then rescaled with the others
    assert p.delta == 0.0
    assert (p.w0, p.w1, p.w2) == pytest.approx((0.1, 0.8, 0.1))


def test_numeric_strings_are_read_as_numbers():
    p = renormalise({"alpha": "0.6", "beta": "0.2", "gamma": "0.2", "delta": "0.1"})
    assert (p.alpha, p.beta, p.gamma, p.delta) == pytest.approx((0.6, 0.2, 0.2, 0.1))


def test_missing_keys_take_defaults():
    assert renormalise({}) == DEFAULT_PARAMS
    p = renormalise({"alpha": 1.0})  # beta, gamma default to 1/3 each
    assert (p.alpha, p.beta, p.gamma) == pytest.approx((0.6, 0.2, 0.2))


def test_huge_finite_weights_do_not_overflow():
    p = renormalise({"alpha": 1e308, "beta": 1e308, "gamma": 1e308})
    assert (p.alpha, p.beta, p.gamma) == pytest.approx((1 / 3, 1 / 3, 1 / 3))


def test_accepts_tuned_params_and_is_idempotent():
    bad = TunedParams(alpha=3, beta=1, gamma=0, delta=1, w0=0, w1=0, w2=0)
    once = renormalise(bad)
    assert sums(once) == pytest.approx((1, 1))
    assert once.delta == 0.2
    assert renormalise(once).model_dump() == pytest.approx(once.model_dump())
