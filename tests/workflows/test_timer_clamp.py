"""The user workflow's maturity timer never overflows: a deadline too far for a timedelta (a
turn stamped in microseconds or nanoseconds, which older clients sent) failed every workflow
task; the loop clamps the timer instead (a path that only ever crashed: no patch)."""

from __future__ import annotations

import math
from datetime import timedelta

from mnemoflow.workflows.user_memory import MAX_TIMER, timer_length

NOW = 1_796_000_000.0


def test_the_timer_never_overflows() -> None:
    assert timer_length(NOW + 5, NOW) == timedelta(seconds=5)
    assert timer_length(NOW + 0.25, NOW) == timedelta(seconds=0.25)
    assert timer_length(NOW - 3, NOW) == timedelta(seconds=1)  # passed: never spin hot
    for due in (NOW * 1e9, 1e18 + NOW, 8.64e13 + NOW, math.inf, math.nan):
        assert timer_length(due, NOW) == MAX_TIMER == timedelta.max
    assert timer_length(NOW + 8.6e13, NOW) < MAX_TIMER
