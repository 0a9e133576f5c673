"""Renormalising tuned scoring parameters, which come from an LLM and are never trusted.

An LLM may answer with strings, NaN, negative weights or weights that do not sum to 1. Rather
than reject the answer (and pay for another call), every value is repaired into a valid
TunedParams: unusable values fall back to the default, negative weights are clipped to 0, each
weight group is renormalised to sum to 1 and the bias delta is clipped to a narrow band.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from mnemoflow.models.params import TunedParams

DEFAULT_PARAMS = TunedParams()
"""The defaults of docs/ARCHITECTURE.md: alpha = beta = gamma = 1/3, delta = 0, w = .1/.8/.1."""

DELTA_MIN = -0.1
DELTA_MAX = 0.2
_SCORE_WEIGHTS = ("alpha", "beta", "gamma")
_IMPORTANCE_WEIGHTS = ("w0", "w1", "w2")


def _number(value: object, default: float) -> float:
    """A finite float, or the default for anything else (bools are not numbers here)."""
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int | float | str):
        try:
            number = float(value)  # numeric strings ("0.4") are a common LLM habit
        except ValueError:
            return default
        return number if math.isfinite(number) else default
    return default


def _normalised(values: Sequence[float], fallback: Sequence[float]) -> tuple[float, ...]:
    """Clip to >= 0 and scale to sum 1; all zero falls back. Scaling by the max first keeps
    huge-but-finite values from overflowing the sum to inf."""
    clipped = [max(0.0, v) for v in values]
    top = max(clipped)
    if top <= 0.0:
        return tuple(fallback)
    scaled = [v / top for v in clipped]
    total = sum(scaled)
    return tuple(v / total for v in scaled)


def renormalise(raw: Mapping[str, object] | TunedParams) -> TunedParams:
    """Valid parameters from anything: alpha+beta+gamma = 1, w0+w1+w2 = 1, delta in [-.1, .2]."""
    values: Mapping[str, object] = raw.model_dump() if isinstance(raw, TunedParams) else raw
    defaults = DEFAULT_PARAMS.model_dump()
    got = {name: _number(values.get(name), defaults[name]) for name in defaults}
    alpha, beta, gamma = _normalised(
        [got[n] for n in _SCORE_WEIGHTS], [defaults[n] for n in _SCORE_WEIGHTS]
    )
    w0, w1, w2 = _normalised(
        [got[n] for n in _IMPORTANCE_WEIGHTS], [defaults[n] for n in _IMPORTANCE_WEIGHTS]
    )
    delta = min(DELTA_MAX, max(DELTA_MIN, got["delta"]))
    return TunedParams(alpha=alpha, beta=beta, gamma=gamma, delta=delta, w0=w0, w1=w1, w2=w2)
