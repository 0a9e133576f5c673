"""Memory configuration: the vocation presets of docs/ARCHITECTURE.md and every tuning knob.

The config travels inside workflow inputs, so it must stay a plain pydantic model with
deterministic defaults (no clock, no environment).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

#: Type values of docs/ARCHITECTURE.md, "The memory model" (unknown types score 0).
TYPE_VALUES: dict[str, float] = {
    "identity": 0.95,
    "decision": 0.85,
    "preference": 0.80,
    "fact": 0.60,
    "episode": 0.40,
    "chat": 0.15,
}
FRAGMENT_TYPES: tuple[str, ...] = tuple(TYPE_VALUES)


class Vocation(StrEnum):
    """The three presets of the in-process predecessor, plus `custom` (keep whatever was given)."""

    CUSTOMER_SERVICE = "customer service"
    COLLABORATIVE_CREATION = "collaborative creation"
    ACCOMPANY = "accompany"
    CUSTOM = "custom"


class Preset(BaseModel):
    """Time constants and gates of one vocation."""

    model_config = ConfigDict(allow_inf_nan=False)

    tau_m: float = Field(gt=0, description="maturity time constant, seconds")
    c_m: float = Field(gt=0, description="maturity shape")
    tau: float = Field(gt=0, description="decay time constant, seconds")
    c: float = Field(gt=0, description="decay shape")
    slice_gate: float = Field(gt=0, lt=1, description="maturity at which messages are sliced")
    long_term_gate: float = Field(
        gt=0, lt=1, description="maturity at which fragments are inducted"
    )


PRESETS: dict[Vocation, Preset] = {
    Vocation.CUSTOMER_SERVICE: Preset(
        tau_m=600, c_m=0.5, tau=43200, c=0.5, slice_gate=0.7, long_term_gate=0.9
    ),
    Vocation.COLLABORATIVE_CREATION: Preset(
        tau_m=3600, c_m=1.0, tau=604800, c=0.7, slice_gate=0.9, long_term_gate=0.98
    ),
    Vocation.ACCOMPANY: Preset(
        tau_m=7200, c_m=0.8, tau=86400, c=0.5, slice_gate=0.8, long_term_gate=0.95
    ),
}


class BudgetPattern(StrEnum):
    """How the window budget is expressed (as in the in-process predecessor)."""

    FRACTION = "fraction"
    TOKENS = "tokens"
    MESSAGES = "messages"


class MemoryConfig(BaseModel):
    """Everything that shapes one user's memory; carried in the user workflow's input.

    Every number is finite: an infinity or NaN would travel to the workflow as JSON null and
    fail each of its tasks for good (that user's memory stopped, whatever config came after).
    """

    model_config = ConfigDict(allow_inf_nan=False)

    vocation: Vocation = Vocation.CUSTOMER_SERVICE
    tau_m: float = Field(600, gt=0)
    c_m: float = Field(0.5, gt=0)
    tau: float = Field(43200, gt=0)
    c: float = Field(0.5, gt=0)
    slice_gate: float = Field(0.7, gt=0, lt=1)
    long_term_gate: float = Field(0.9, gt=0, lt=1)

    top_k: int = Field(4, ge=1, le=64, description="fragments injected per model call")
    retrieve_k: int | None = Field(
        256,
        ge=1,
        description="candidates of a round's selection: the nearest this many by vector, plus "
        "the nearest of the always-injected types once the user has more; None scores all of "
        "the user's fragments (a read that grows with history)",
    )
    always_inject_types: tuple[str, ...] = ("identity", "preference")
    theme_cap: int | None = Field(None, ge=1, description="max fragments of one theme")
    published_candidates: int = Field(
        12,
        ge=1,
        le=64,
        description="ranked fragments published, so the hot path can skip ones in its window",
    )

    memory_budget_tokens: int = Field(
        1200, ge=64, le=32000, description="tokens of the memory section (profile + fragments)"
    )
    search_weights: tuple[float, float, float] = Field(
        (0.7, 0.1, 0.2),
        description="alpha, beta, gamma of the per-call search: relevance to the question leads",
    )

    @field_validator("search_weights")
    @classmethod
    def _weights(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(w < 0 for w in value) or sum(value) <= 0:
            raise ValueError("search weights are at least 0 and not all 0")
        return value

    search_deadline_s: float = Field(
        0.25, gt=0, le=10, description="a model call waits this long for its memory search"
    )

    pattern: BudgetPattern = BudgetPattern.FRACTION
    trigger_threshold: float = Field(0.8, gt=0, description="budget: fraction, tokens or messages")
    hard_ceiling: float = Field(0.95, gt=0, le=1, description="fraction of max input tokens")
    max_input_tokens: int = Field(64000, ge=256)

    max_turns_per_round: int = Field(64, ge=1, le=500)
    max_turn_chars: int = Field(
        8000,
        ge=64,
        description=(
            "longest text of one handed-over turn: a longer human or AI message is handed over"
            " whole, as consecutive parts of at most this many characters (cut at sentence"
            " ends; each part its own identity), so a round's input stays bounded; tool and"
            " system outputs, which are not memory, are cut to it"
        ),
    )
    max_message_chars: int = Field(
        200_000,
        ge=64,
        le=1_000_000,
        description=(
            "longest human or AI message handed over whole (in parts): the rest of a longer one"
            " is cut, logged as an error and counted in mnemoflow_handover_cut_messages_total"
            " and ..._cut_chars_total. 200,000 characters are 200 KB of English and at most"
            " 800 KB of UTF-8 (emoji): one such message waiting for its round stays inside"
            " Temporal's 2 MB payload limit of the user workflow's state (continue-as-new);"
            " its hand-over is split into signals of at most 512 KB (middleware/payloads.py)"
        ),
    )
    profile_list_limit: int = Field(12, ge=1, le=100)
    failed_round_backoff_s: float = Field(
        600, ge=0, description="wait before re-slicing after a failed round"
    )

    def updated(
        self, vocation: Vocation | str | None = None, params: Mapping[str, object] | None = None
    ) -> MemoryConfig:
        """This config with another vocation's preset and/or some fields changed.

        A vocation brings its preset's time constants and gates; `params` then override any
        field. Changing a preset field without naming a vocation makes the config `custom`.
        Raises ValueError naming every unknown or invalid field; nothing is half-applied.
        """
        params = dict(params or {})
        unknown = sorted(set(params) - set(type(self).model_fields))
        if unknown:
            raise ValueError(f"unknown memory config fields: {', '.join(unknown)}")
        values = self.model_dump()
        if vocation is not None:
            voc = Vocation(vocation)
            values["vocation"] = voc
            if voc in PRESETS:
                values.update(PRESETS[voc].model_dump())
        elif set(params) & set(Preset.model_fields) and "vocation" not in params:
            values["vocation"] = Vocation.CUSTOM
        values.update(params)
        try:
            return type(self).model_validate(values)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
            )
            raise ValueError(f"invalid memory config: {problems}") from None

    @classmethod
    def from_vocation(cls, vocation: Vocation | str, **overrides: object) -> MemoryConfig:
        """Config with a preset's time constants and gates, then any overrides."""
        voc = Vocation(vocation)
        values: dict[str, object] = {"vocation": voc}
        if voc in PRESETS:
            values.update(PRESETS[voc].model_dump())
        values.update(overrides)
        return cls.model_validate(values)
