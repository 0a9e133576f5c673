"""Trigger rules (docs/ARCHITECTURE.md): when a round is due, when the window is over budget, and
where trimming may start. Three decisions, kept apart, each a pure function of numbers.
"""

from __future__ import annotations

from mnemoflow.memory.formulas import time_to_maturity
from mnemoflow.models.config import BudgetPattern, MemoryConfig

# Scripts written without spaces, where a tokenizer spends about one token per character.


def slice_due_at(oldest_unsliced_time: float, config: MemoryConfig) -> float:
    """When a thread's round is due: its oldest un-sliced message reaches the slice gate."""
    return oldest_unsliced_time + time_to_maturity(config.slice_gate, config.tau_m, config.c_m)


def induction_due_at(created_at: float, config: MemoryConfig) -> float:
    """When a fragment is folded into the profile: it reaches the long-term gate."""
    return created_at + time_to_maturity(config.long_term_gate, config.tau_m, config.c_m)


def budget_reached(n_messages: int, n_tokens: int, config: MemoryConfig) -> bool:
    """Whether the window reached its budget, as `config.pattern` expresses it."""
    threshold = config.trigger_threshold
    if config.pattern is BudgetPattern.FRACTION:
        return n_tokens >= threshold * config.max_input_tokens
    if config.pattern is BudgetPattern.TOKENS:
        return n_tokens >= threshold
    return n_messages >= threshold


def ceiling_reached(n_tokens: int, config: MemoryConfig) -> bool:
    """Whether the window reached the hard ceiling: the round is then due at once."""
    return n_tokens >= config.hard_ceiling * config.max_input_tokens


def trim_start(positions_total: int, indexed: int, last_human_pos: int | None) -> int:
    """The first position kept in a trimmed model request.

    Only messages below the indexed watermark may go (they are in long-term memory), and never
    the latest human message, or the model would not see what it is answering. The result lies
    in [0, positions_total].
    """
    start = indexed if last_human_pos is None else min(indexed, last_human_pos)
    return max(0, min(start, positions_total))
