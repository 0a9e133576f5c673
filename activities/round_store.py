"""The lean round's store step as one activity: index, select, publish (local activity first).

The same work as the `index`, `select` and `publish` activities, in one call on the workflow's
worker, so a round leaves one marker event in its history instead of three activities and their
workflow tasks (docs/ARCHITECTURE.md, "The round"). Every step is idempotent (business-id keys,
a version-monotonic publish), so a retried call rewrites the same rows and context. The round
runs it as an ordinary activity when the local attempts did not succeed soon (then it
heartbeats, like `index`). Permanent errors become non-retryable ApplicationErrors with the
searchable type of models/errors.py.
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.exceptions import ApplicationError

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.fragments import only_new, sweep_failed_rounds
from mnemoflow.activities.heartbeat import heartbeating
from mnemoflow.activities.read_model import ReadModel
from mnemoflow.activities.search_corpus import SearchCorpus
from mnemoflow.activities.theme_weights import ThemeWeights
from mnemoflow.memory.selection import select as select_fragments
from mnemoflow.models.contracts import RankedRef
from mnemoflow.models.errors import InvalidInputError, PayloadTooLargeError, StaleEpochError
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.round_store import (
    STORE_ROUND,
    STORED_FLOOR,
    StoredFloorInput,
    StoredFloorOutput,
    StoreRoundInput,
    StoreRoundOutput,
    held_by_round,
    short_id,
    unpack_params,
)

#: Scores recorded by id (shape 3) keep this many decimal places: ranks are decided before.
SCORE_PLACES = 6


class RoundStoreActivities:
    """The store step of a lean round over the worker's fragment store and read model."""

    def __init__(
        self,
        store: FragmentStore,
        read_model: ReadModel,
        corpus: SearchCorpus | None = None,
        themes: ThemeWeights | None = None,
    ) -> None:
        self.store = store
        self.read_model = read_model
        self.corpus = corpus
        self.themes = themes

    @activity.defn(name=STORED_FLOOR)
    async def stored_floor(self, inp: StoredFloorInput) -> StoredFloorOutput:
        """The highest round number stored for the user and the version of its context in
        Redis, which a fresh history numbers above (fragment ids derive from round numbers)."""
        try:
            highest = await self.store.highest_round(inp.user_id)
            published = await self.read_model.get(inp.user_id)
            epoch = await self.store.forget_epoch(inp.user_id)
        except InvalidInputError as exc:
            raise ApplicationError(str(exc), type=exc.type, non_retryable=True) from exc
        floor = max(epoch, published.forget_epoch if published else 0)
        epochs = getattr(self.store, "epochs", None)
        if epochs is not None:
            # The record exists from the user's first history on (at 0 before any forget), so
            # an agent that finds it absent knows it was lost, not that it is 0.
            await asyncio.to_thread(epochs.advance, inp.user_id, floor)
        return StoredFloorOutput(
            round_no=highest,
            context_version=published.version if published else 0,
            forget_epoch=floor,
        )

    @activity.defn(name=STORE_ROUND)
    async def store_round(self, inp: StoreRoundInput) -> StoreRoundOutput:
        """Upsert the round's fragments, select the context and publish it."""
        if activity.info().is_local:
            return await self._store(inp)
        # As an ordinary activity (the stores were slow or down): heartbeat, so a killed worker
        # is noticed in seconds and another one retries.
        async with heartbeating():
            return await self._store(inp)

    async def _store(self, inp: StoreRoundInput) -> StoreRoundOutput:
        sel, config = inp.select, inp.select.config
        try:
            if inp.new_weights and self.themes is not None:  # shape 5: for later rounds
                await self.themes.put(
                    sel.user_id, {k: unpack_params(v) for k, v in inp.new_weights.items()}
                )
            swept, swept_rows = 0, list[Fragment]()
            if inp.sweep_rounds:  # rows of failed rounds go first: they are no one's repeats
                swept, swept_rows = await sweep_failed_rounds(
                    self.store, self.corpus, sel.user_id, inp.sweep_rounds
                )
            # Repeats add nothing. The selection query rides in the fragments' forward pass
            # (FragmentStore); the store refuses a write once a forget moved past the round's
            # epoch.
            fresh = await only_new(self.store, list(inp.fragments), sel.query)
            written = (
                await self.store.upsert_vectors(fresh, query=sel.query, epoch=inp.epoch)
                if fresh
                else []
            )
            if self.corpus is not None and written:
                await self.corpus.added([f for f, _ in written])
            # Past retrieve_k, the fragments the round holds (published last, and its own)
            # stay candidates, so a far identity fragment keeps its seat (FragmentStore).
            candidates = await self.store.candidates(
                sel.user_id, sel.query, config.retrieve_k, config.always_inject_types, inp.known
            )
            selection = select_fragments(
                candidates,
                sel.params,
                config,
                sel.now,
                theme=sel.theme,
                params_source=sel.params_source,
            )
            ranked = selection.ranked[: sel.limit or config.published_candidates]
            context = inp.context.model_copy(update={"fragments": ranked})
            published = await self.read_model.publish(context)
        except (InvalidInputError, PayloadTooLargeError, StaleEpochError) as exc:
            raise ApplicationError(str(exc), type=exc.type, non_retryable=True) from exc
        known = None if inp.known is None else set(inp.known)
        picked = [c for c in selection.log.candidates if c.picked]
        return StoreRoundOutput(
            indexed=[f.id for f, _ in written],
            # Contents the round already holds are not recorded again (shape 3), nor those of
            # fragments made by the rounds the user workflow vouches for.
            fragments=ranked
            if known is None
            else [
                c
                for c in ranked[: inp.contents_top]
                if c.id not in known and not held_by_round(sel.user_id, c.id, inp.known_from_round)
            ],
            ranked=[]
            if known is None
            else [
                RankedRef(id=short_id(sel.user_id, c.id), score=round(c.score, SCORE_PLACES))
                for c in ranked
            ],
            candidates=len(selection.log.candidates),
            picked=picked if known is None else [],
            picked_terms={}
            if known is None
            else {c.fragment_id: [round(x, 3) for x in (c.cos, c.R, c.T, c.F)] for c in picked},
            published_bytes=published.bytes,
            swept_rounds=list(inp.sweep_rounds),
            swept=swept,
            swept_rows=swept_rows,
        )
