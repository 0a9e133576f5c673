"""Explicitly remembered facts go into the published context at once, not at the next round.

A fact the user asked to remember must shape the very next model call. The remember update
stores the fragment, then publishes the current context with the fragment in front, scored as
high as the best published one so the hot path's re-ranking keeps it among the injected ones.
Later rounds select it (or not) like any other fragment.
"""

from __future__ import annotations

from datetime import timedelta

from mnemoflow.models.contracts import ContextFragment, InjectedContext

#: Patch id of publishing on remember (histories recorded before it did not publish).
REMEMBER_PUBLISHES = "remember-publishes-context"
#: A best-effort publish: the context is already in workflow state (the query fallback serves
#: it, and the next publish carries it), so a remember does not wait out a Redis outage.
REMEMBER_PUBLISH_BOUND = timedelta(seconds=30)


def with_remembered(
    context: InjectedContext, fragment: ContextFragment, now: float, limit: int | None = None
) -> InjectedContext:
    """The next version of `context` with `fragment` first (once), at the best published score.

    With a `limit` (the published candidates), a full list drops its lowest-ranked fragment.
    """
    rest = [f for f in context.fragments if f.id != fragment.id]
    best = max((f.score for f in rest), default=fragment.score)
    size = len(rest) + 1 if limit is None else max(limit, 1)
    front = fragment.model_copy(update={"score": max(best, fragment.score)})
    return context.model_copy(
        update={
            "fragments": [front, *rest][:size],
            "version": context.version + 1,
            "generated_at": now,
        }
    )
