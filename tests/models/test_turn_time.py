"""ChatTurn.time is bounded: no turn a workflow decodes can put its maturity timer past what a
timedelta holds (a nanosecond stamp failed the user workflow's task forever)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from langchain_core.messages import HumanMessage
from pydantic import ValidationError

from mnemoflow.memory.triggers import slice_due_at
from mnemoflow.middleware.window import to_turns
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import SubmitEvent
from mnemoflow.models.turns import MAX_TURN_TIME, ChatTurn

NOW = 1_796_000_000.0


def turn(time: float) -> ChatTurn:
    return ChatTurn(thread_id="t", position=0, role="human", content="x", time=time)


@pytest.mark.parametrize("time", [NOW * 1e6, NOW * 1e9, 1e18, math.inf, -math.inf, math.nan])
def test_a_time_past_the_bound_or_not_finite_is_a_clear_error(time: float) -> None:
    with pytest.raises(ValidationError, match=r"must be unix seconds.*microseconds or nanosec"):
        turn(time)
    with pytest.raises(ValidationError, match="must be unix seconds"):
        SubmitEvent.model_validate_json(
            SubmitEvent(event_id="e", turns=[turn(NOW)])
            .model_dump_json()
            .replace(repr(NOW), "1e18")
        )


@pytest.mark.parametrize("time", [0.0, NOW, NOW * 1e3, MAX_TURN_TIME])
def test_seconds_and_legacy_milliseconds_still_decode(time: float) -> None:
    """JavaScript milliseconds stay valid: older clients sent them, and running workflows hold
    them in their histories and state, which must still decode."""
    assert ChatTurn.model_validate_json(turn(time).model_dump_json()).time == time


def test_no_turn_within_the_bound_overflows_a_timer() -> None:
    for preset in ("customer service", "collaborative creation", "accompany"):
        due = slice_due_at(MAX_TURN_TIME, MemoryConfig.from_vocation(preset))
        assert timedelta(seconds=due - NOW) < timedelta.max


@pytest.mark.parametrize("exponent", range(0, 400, 7))
def test_the_middleware_never_builds_a_turn_past_the_bound(exponent: int) -> None:
    """Whatever number a caller stamps, the turn handed over is valid (read as seconds)."""
    for value in (10**exponent, float(f"1.7e{min(exponent, 308)}"), str(10**exponent)):
        msg = HumanMessage("x", id="m", additional_kwargs={"time": value})
        (handed,) = to_turns([msg], "t", NOW)
        assert 0 < handed.time <= MAX_TURN_TIME
