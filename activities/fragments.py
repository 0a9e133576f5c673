"""Fragment activities: index (embed + upsert), select (candidates + scoring), reinforce.

Each is a thin shell over the FragmentStore and the pure selection of memory.selection. Store
and network failures propagate unchanged so Temporal's retry policy retries them; permanent
problems (an unusable user or fragment id) become non-retryable ApplicationErrors whose `type`
is the searchable name from mnemoflow.models.errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio import activity
from temporalio.exceptions import ApplicationError

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.heartbeat import heartbeating
from mnemoflow.activities.search_corpus import SearchCorpus
from mnemoflow.memory.selection import select as select_fragments
from mnemoflow.models.contracts import (
    ActivityName,
    DeleteFragmentsInput,
    DeleteFragmentsOutput,
    IndexInput,
    IndexOutput,
    ReinforceInput,
    ReinforceOutput,
    SelectInput,
    SelectOutput,
)
from mnemoflow.models.errors import InvalidInputError, PayloadTooLargeError
from mnemoflow.models.fragments import SelectionLog

# Scoring-log lines returned per selection. With retrieve_k=None every fragment of the user is a
# candidate, and thousands of lines would approach Temporal's 2 MB payload limit; the best lines
# and every picked one are what debugging the formula needs.
MAX_LOG_CANDIDATES = 256


@asynccontextmanager
async def _permanent_errors() -> AsyncIterator[None]:
    """Turn mnemoflow's permanent errors into non-retryable ApplicationErrors."""
    try:
        yield
    except (InvalidInputError, PayloadTooLargeError) as exc:
        raise ApplicationError(str(exc), type=exc.type, non_retryable=True) from exc


def bounded_log(log: SelectionLog, limit: int = MAX_LOG_CANDIDATES) -> SelectionLog:
    """The log with at most `limit` best lines plus every picked line, in score order."""
    if len(log.candidates) <= limit:
        return log
    kept = [c for i, c in enumerate(log.candidates) if i < limit or c.picked]
    return log.model_copy(update={"candidates": kept})


class FragmentActivities:
    """Activities over one FragmentStore (shared by every activity task of the worker)."""

    def __init__(self, store: FragmentStore, corpus: SearchCorpus | None = None) -> None:
        """`corpus`: the Redis search corpus the hot path searches, kept in step with the store."""
        self.store = store
        self.corpus = corpus

    @activity.defn(name=ActivityName.INDEX)
    async def index(self, inp: IndexInput) -> IndexOutput:
        """Embed and upsert the fragments; a retry rewrites the same rows (business-id keys)."""
        async with _permanent_errors(), heartbeating():
            written = await self.store.upsert_vectors(inp.fragments)
            if self.corpus is not None:
                await self.corpus.add_best_effort([f for f, _ in written], [v for _, v in written])
        return IndexOutput(ids=[f.id for f, _ in written])

    @activity.defn(name=ActivityName.SELECT)
    async def select(self, inp: SelectInput) -> SelectOutput:
        """Score the user's candidates for the query and return the ranked fragments and log."""
        config = inp.config
        async with _permanent_errors():
            candidates = await self.store.candidates(inp.user_id, inp.query, config.retrieve_k)
        selection = select_fragments(
            candidates,
            inp.params,
            config,
            inp.now,
            theme=inp.theme,
            params_source=inp.params_source,
        )
        size = inp.limit or config.published_candidates
        if self.corpus is not None:
            await self.corpus.reconcile(self.store, inp.user_id)
        return SelectOutput(fragments=selection.ranked[:size], log=bounded_log(selection.log))

    @activity.defn(name=ActivityName.REINFORCE)
    async def reinforce(self, inp: ReinforceInput) -> ReinforceOutput:
        """Strengthen the fragments one model call used, once per call id."""
        async with _permanent_errors():
            updated = await self.store.reinforce(
                inp.user_id, inp.fragment_ids, inp.call_id, inp.now
            )
        return ReinforceOutput(updated=updated)

    @activity.defn(name=ActivityName.DELETE_FRAGMENTS)
    async def delete_fragments(self, inp: DeleteFragmentsInput) -> DeleteFragmentsOutput:
        """Delete some (ids) or all (ids None) of the user's fragments; idempotent."""
        async with _permanent_errors():
            if inp.ids is None:
                deleted = await self.store.delete_user(inp.user_id)
                if self.corpus is not None:
                    await self.corpus.delete_user(inp.user_id)
            else:
                deleted = await self.store.delete(inp.user_id, inp.ids)
                if self.corpus is not None:
                    await self.corpus.remove(inp.user_id, inp.ids)
        return DeleteFragmentsOutput(deleted=deleted)
