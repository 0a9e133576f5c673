"""Trigger rules: durable-timer due times, budgets, the hard ceiling and where trimming starts."""

import math

import pytest

from mnemoflow.memory.text import estimate_tokens
from mnemoflow.memory.triggers import (
    budget_reached,
    ceiling_reached,
    induction_due_at,
    slice_due_at,
    trim_start,
)
from mnemoflow.models.config import MemoryConfig, Vocation

CS = MemoryConfig.from_vocation(Vocation.CUSTOMER_SERVICE)


def test_slice_due_about_870_seconds_after_the_oldest_unsliced_message():
    assert slice_due_at(1000.0, CS) == pytest.approx(1000 + 600 * math.log(1 / 0.3) ** 2)
    assert slice_due_at(1000.0, CS) - 1000 == pytest.approx(869.8, abs=0.1)


def test_induction_due_about_3181_seconds_after_creation():
    assert induction_due_at(50.0, CS) == pytest.approx(50 + 600 * math.log(10) ** 2)
    assert induction_due_at(50.0, CS) - 50 == pytest.approx(3181.1, abs=0.1)


def test_collaborative_creation_preset_due_times():
    cfg = MemoryConfig.from_vocation(Vocation.COLLABORATIVE_CREATION)
    # c_m = 1: dt = tau_m * -ln(1 - v)
    assert slice_due_at(0.0, cfg) == pytest.approx(3600 * math.log(10))
    assert induction_due_at(0.0, cfg) == pytest.approx(3600 * math.log(50))


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("a", 1),
        ("x" * 33, 10),  # exactly 33 / 3.3, with no floating-point surprise
        ("x" * 34, 11),
        ("你好世界", 4),  # one token per CJK character
        ("你好 world", 2 + 2),  # 2 CJK + ceil(6 / 3.3)
        ("こんにちは", 5),
    ],
)
def test_estimate_tokens(text, tokens):
    assert estimate_tokens(text) == tokens


def test_budget_fraction_of_max_input_tokens():
    cfg = MemoryConfig(pattern="fraction", trigger_threshold=0.8, max_input_tokens=1000)
    assert not budget_reached(999, 799, cfg)
    assert budget_reached(1, 800, cfg)


def test_budget_in_tokens():
    cfg = MemoryConfig(pattern="tokens", trigger_threshold=5000)
    assert not budget_reached(10_000, 4999, cfg)
    assert budget_reached(1, 5000, cfg)


def test_budget_in_messages():
    cfg = MemoryConfig(pattern="messages", trigger_threshold=20)
    assert not budget_reached(19, 10**9, cfg)
    assert budget_reached(20, 0, cfg)


def test_ceiling_is_a_fraction_of_max_input_tokens():
    cfg = MemoryConfig(hard_ceiling=0.95, max_input_tokens=1000)
    assert not ceiling_reached(949, cfg)
    assert ceiling_reached(950, cfg)


@pytest.mark.parametrize(
    ("total", "indexed", "last_human", "start"),
    [
        (20, 12, 18, 12),  # trim everything indexed
        (20, 12, 7, 7),  # never past the latest human message
        (20, 12, None, 12),
        (20, 0, 5, 0),  # nothing indexed: nothing trimmed
        (20, -3, None, 0),  # never negative
        (10, 15, None, 10),  # never beyond the window
    ],
)
def test_trim_start(total, indexed, last_human, start):
    assert trim_start(total, indexed, last_human) == start
