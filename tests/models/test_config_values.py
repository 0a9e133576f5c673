"""Every number of a MemoryConfig is finite (docs/ARCHITECTURE.md, "The user workflow").

An infinity or NaN (`MemoryConfig(tau=float("inf"))`) was accepted: it travelled to the user
workflow as JSON null, every workflow task failed to decode it, and that user's memory stopped
for good (0 of 4 messages indexed; a correct config afterwards could not mend it).
"""

from __future__ import annotations

import math

import pytest

from mnemoflow.models.config import MemoryConfig, Preset

FLOATS = [n for n, f in MemoryConfig.model_fields.items() if f.annotation in (float, "float")]


def test_there_are_float_fields_to_check() -> None:
    assert {"tau", "tau_m", "trigger_threshold", "failed_round_backoff_s"} <= set(FLOATS)


@pytest.mark.parametrize("field", FLOATS)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_no_float_field_takes_infinity_or_nan(field: str, bad: float) -> None:
    with pytest.raises(ValueError, match=field):
        MemoryConfig(**{field: bad})
    with pytest.raises(ValueError, match=field):
        MemoryConfig().updated(params={field: bad})


@pytest.mark.parametrize(
    "weights", [(math.nan, 0.1, 0.2), (0.7, math.inf, 0.2), (-0.5, 0.1, 0.2), (0.0, 0.0, 0.0)]
)
def test_search_weights_are_finite_non_negative_and_not_all_zero(
    weights: tuple[float, float, float],
) -> None:
    with pytest.raises(ValueError, match="search_weights"):
        MemoryConfig(search_weights=weights)


def test_good_values_still_pass_and_survive_json() -> None:
    config = MemoryConfig(search_weights=(1.0, 0.0, 0.0), tau=1e9, failed_round_backoff_s=0)
    assert MemoryConfig.model_validate_json(config.model_dump_json()) == config
    with pytest.raises(ValueError):
        Preset(tau_m=math.inf, c_m=1, tau=1, c=1, slice_gate=0.5, long_term_gate=0.5)
