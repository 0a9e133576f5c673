"""The formulas of docs/ARCHITECTURE.md, "The memory model", exactly, as pure functions.

Times are seconds; `dt` is an age (now minus a timestamp) and negative ages count as 0, since a
clock skew between agent and worker must never make a message more than brand new.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from mnemoflow.models.config import TYPE_VALUES

REINFORCE_K = 0.5


def maturity(dt: float, tau_m: float, c_m: float) -> float:
    """M(dt) = 1 - exp(-(dt/tau_m)^c_m)."""
    dt = max(0.0, dt)
    return 1.0 - math.exp(-((dt / tau_m) ** c_m))


def time_decay(dt: float, tau: float, c: float) -> float:
    """T(dt) = exp(-(dt/tau)^c)."""
    dt = max(0.0, dt)
    return math.exp(-((dt / tau) ** c))


def time_to_maturity(v: float, tau_m: float, c_m: float) -> float:
    """dt at which M(dt) = v: tau_m * (-ln(1 - v))^(1/c_m). Used for durable timers."""
    if not 0.0 <= v < 1.0:
        raise ValueError(f"maturity level must be in [0, 1), got {v}")
    return tau_m * (-math.log(1.0 - v)) ** (1.0 / c_m)


def type_union(types: Iterable[str]) -> float:
    """u = 1 - prod(1 - v_i) over the distinct types (unknown types are worth 0)."""
    remaining = 1.0
    for t in set(types):
        remaining *= 1.0 - TYPE_VALUES.get(t, 0.0)
    return 1.0 - remaining


def importance(
    types: Iterable[str], strengthen_count: int, w0: float, w1: float, w2: float
) -> float:
    """F = clamp(w0 + w1*u + w2*(1 - exp(-k*n)), 0, 1) with k = 0.5."""
    u = type_union(types)
    n = max(0, strengthen_count)
    raw = w0 + w1 * u + w2 * (1.0 - math.exp(-REINFORCE_K * n))
    return min(1.0, max(0.0, raw))


def relevance(cosines: Sequence[float]) -> list[float]:
    """R_i = max(0, (cos_i - median) / (max - median)); all 0 when max == median."""
    if not cosines:
        return []
    ordered = sorted(cosines)
    n = len(ordered)
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0
    top = ordered[-1]
    span = top - median
    if span <= 0.0:
        return [0.0] * n
    return [max(0.0, (c - median) / span) for c in cosines]


def score(
    r: float, t: float, f: float, alpha: float, beta: float, gamma: float, delta: float
) -> float:
    """S = alpha*R + beta*T + gamma*F + delta."""
    return alpha * r + beta * t + gamma * f + delta
