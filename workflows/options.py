"""Small deterministic helpers shared by the two workflows (no I/O, sandbox-safe)."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from mnemoflow.models import search_attributes as sa


def theme_key(theme: str) -> str:
    """Cache key of a theme: case and surrounding space do not make a new theme."""
    return " ".join(theme.lower().split())[:200]


def round_search_attributes(
    *,
    user: str | None = None,
    round_no: int | None = None,
    trigger: str | None = None,
    theme: str | None = None,
    outcome: str | None = None,
) -> TypedSearchAttributes:
    """The search attributes of a round; only the given ones (children do not inherit them)."""
    pairs: list[SearchAttributePair] = []
    if user is not None:
        pairs.append(SearchAttributePair(sa.USER, user))
    if round_no is not None:
        pairs.append(SearchAttributePair(sa.ROUND, round_no))
    if trigger is not None:
        pairs.append(SearchAttributePair(sa.TRIGGER, trigger))
    if theme is not None:
        pairs.append(SearchAttributePair(sa.THEME, theme[:200]))
    if outcome is not None:
        pairs.append(SearchAttributePair(sa.OUTCOME, outcome))
    return TypedSearchAttributes(pairs)


def upsert_round_attributes(*, theme: str | None = None, outcome: str | None = None) -> None:
    """Record a round's theme or outcome as it becomes known (visible in the Temporal UI)."""
    updates: list = []
    if theme is not None:
        updates.append(sa.THEME.value_set(theme[:200]))
    if outcome is not None:
        updates.append(sa.OUTCOME.value_set(outcome))
    if updates:
        workflow.upsert_search_attributes(updates)


def failure_text(err: BaseException) -> str:
    """The innermost failure message, which is what an operator needs to read."""
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {err}"[:1000]
