"""MemoryRoundWorkflow: one memory event of one user, slice -> index -> tune -> select -> publish.

Id: `<user workflow id>/round-<n>` (REJECT_DUPLICATE), started only by UserMemoryWorkflow, which
owns every piece of state; the round is a pure function of its input plus activity results, so a
retried or replayed round writes the same fragment rows (ids derive from user, round, index).

Each step is an activity with explicit timeouts and a retry policy. An LLM outage of hours is
absorbed by retries up to the schedule-to-close bound; past it the round fails visibly and its
messages stay un-indexed for a later round or an operator retry.

Six shapes (docs/ARCHITECTURE.md, "The round"), chosen by the input's `shape` (the user
workflow sets it; rounds recorded before the lean shape have none and replay unchanged):

- 6, one LLM activity (every new round): as 5 where the LLM calls share the workflow's queue.
  Where they have a queue of their own (the chart's layout, a queue-wide rate limit), the slice,
  the lookup of the stored weights and the tunes of the themes still missing are one ordinary
  activity on that queue (`SLICE_AND_TUNE`), not a slice activity and a tune activity per new
  theme: one activity's three events and one workflow task a round, whatever the themes.
- 5, weights looked up (every new round whose LLM calls share the workflow's queue): as 4,
  without the theme cache in the input. The LLM step looks the weights of the themes it sliced
  up in Redis (activities/theme_weights.py) and tunes only those missing; the store step stores
  the new ones; a tune activity (after a failed local attempt) answers with stored weights too.
- 4, by reference (every new round whose LLM calls have a queue of their own): as 3, but of
  the earlier fragments the user workflow lacks, only those among the first `top_k` of the
  selection (what one model call injects) come back with their contents; it holds the others
  by id and the publish activity fills them from the stores. What a round records grows less
  with how many earlier fragments come back into the selection, and the workflow's own answer
  on a Redis miss still has the best. Every fragment the round stored goes back with its
  contents (`made`: the unpublished ones), and nothing made by a round from the input's
  `held_from_round` on travels again: the user workflow keeps those (`recent`).

- 3, lean with local LLM attempts (rounds before shape 4): slice and tune (cache misses only)
  each try once as a local activity when the LLM activities share the round's task queue, and go
  on as their ordinary activity (LLM queue, retries for hours, heartbeats, visible attempts) when
  that one attempt fails or runs past LOCAL_LLM_BOUND; then the store step as in shape 2, then
  one upsert. Payloads are bounded from the first round: the result names the published
  fragments by id and score and carries only the contents the user workflow does not hold.
- 2, lean: slice, then tune for cache misses only, then one local activity that indexes,
  selects and publishes (`activities/round_store.py`), then one search-attribute upsert (theme
  and outcome together). When the stores do not answer within a short bound the store step
  goes on as an ordinary activity, so an outage is visible with its attempts. Slice and tune
  are ordinary activities. The result carries ids, counts and the picked lines of the scoring
  log, not the whole log, nor the profile.
- 1, classic (histories from before): five activities, two upserts, the whole scoring log.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.contracts import (
        ActivityName,
        ContextFragment,
        FragmentRef,
        IndexInput,
        IndexOutput,
        InjectedContext,
        PublishInput,
        PublishOutput,
        RoundInput,
        RoundResult,
        SelectInput,
        SelectOutput,
        SliceInput,
        SliceOutput,
        TuneOutput,
    )
    from mnemoflow.models.fragments import Fragment, FragmentDraft, SelectionLog, theme_key
    from mnemoflow.models.ids import fragment_id
    from mnemoflow.models.params import TunedParams
    from mnemoflow.models.profile import UserProfile
    from mnemoflow.models.round_store import (
        SLICE_AND_TUNE,
        STORE_ROUND,
        SliceTuneInput,
        SliceTuneOutput,
        StoreRoundInput,
        StoreRoundOutput,
        cached_params,
        full_id,
        ordered_themes,
        pack_params,
        tune_requests,
        unpack_params,
        unpack_theme_cache,
    )
    from mnemoflow.models.usage import LLMUsage
    from mnemoflow.workflows.options import (
        PUBLISH_START_TO_CLOSE,
        STORE_HEARTBEAT,
        activity_tune_budget_s,
        llm_activity,
        llm_local_activity,
        local_tune_budget_s,
        store_activity,
        store_local_activity,
        upsert_round_attributes,
    )

QUERY_TURNS = 6
QUERY_CHARS = 2000
#: The input's `shape` from which a round is lean. Versioned by input, not by
#: `workflow.patched`: a patch records a marker and upserts the TemporalChangeVersion search
#: attribute in every round (one more visibility write per round); rounds recorded before the
#: lean shape have no `shape` in their input (1, classic) and replay unchanged.
LEAN_SHAPE = 2
#: From this shape the LLM steps try once locally and the payloads are bounded (see above).
LOCAL_LLM_SHAPE = 3
#: From this shape the result carries the contents of the round's own fragments only.
BY_REFERENCE_SHAPE = 4
#: From this shape the input carries no theme cache: the LLM step looks the round's themes up
#: in Redis (activities/theme_weights.py) and the store step stores the new ones.
STORED_WEIGHTS_SHAPE = 5
#: From this shape a round whose LLM calls have a queue of their own makes them as one ordinary
#: activity there (slice, weights looked up, missing tunes), as shape 3 does locally.
ONE_LLM_ACTIVITY_SHAPE = 6
#: From this shape a round that completes writes no search attributes: its outcome is the
#: execution's own status, and its theme goes to the user workflow's record of it. A round that
#: fails or is cancelled still records both (docs/OPERATIONS.md, "Search attributes"). The
#: completion upsert was one history event and one billed action of every round.
QUIET_COMPLETION_SHAPE = 7

T = TypeVar("T")


@workflow.defn
class MemoryRoundWorkflow:
    """One round of one user's memory: turns in, fragments indexed, context published."""

    @workflow.run
    async def run(self, inp: RoundInput) -> RoundResult:
        """Slice, index, tune (cache misses only), select and publish; record the outcome."""
        if inp.tuned_packed:  # shape 3 sends the theme cache packed
            tuned = {k: unpack_params(v) for k, v in inp.tuned_packed.items()}
            inp = inp.model_copy(update={"tuned": tuned})
        elif inp.tuned_compact:  # shape 4: by `theme_ref`, see `cached_params`
            inp = inp.model_copy(update={"tuned": unpack_theme_cache(inp.tuned_compact)})
        if inp.shape >= LEAN_SHAPE:
            return await self._run_lean(inp)
        try:
            result = await self._run(inp)
        except asyncio.CancelledError:
            if inp.search_attributes:
                upsert_round_attributes(outcome="cancelled")
            raise
        except Exception:
            if inp.search_attributes:
                upsert_round_attributes(outcome="failed")
            raise
        if inp.search_attributes:
            upsert_round_attributes(outcome="completed")
        return result

    # --- the lean shape ------------------------------------------------------------------

    async def _run_lean(self, inp: RoundInput) -> RoundResult:
        """The lean round; its theme and outcome go to the search attributes in one upsert
        (from QUIET_COMPLETION_SHAPE, only when it does not complete)."""
        self._theme: str | None = None
        # Shape 5: the stored weights of the round's themes, as its LLM step found them.
        self._looked_up: dict[str, TunedParams] = {}
        self._lookup_user = inp.user_id if inp.shape >= STORED_WEIGHTS_SHAPE else ""
        try:
            result = await self._lean(inp)
        except asyncio.CancelledError:
            self._record("cancelled", inp)
            raise
        except Exception:
            self._record("failed", inp)
            raise
        self._record("completed", inp)
        return result

    def _record(self, outcome: str, inp: RoundInput) -> None:
        if not inp.search_attributes:
            return
        if outcome == "completed" and inp.shape >= QUIET_COMPLETION_SHAPE:
            return
        upsert_round_attributes(theme=self._theme, outcome=outcome)

    async def _lean(self, inp: RoundInput) -> RoundResult:
        usage: dict[str, LLMUsage] = {}
        slim = inp.shape >= LOCAL_LLM_SHAPE
        # Local LLM attempts only where this worker runs the LLM activities anyway: with an LLM
        # queue of its own (a rate limit, an LLM role), every call goes through that queue.
        pre: dict[str, TuneOutput] = {}
        retried = 0
        if slim and inp.llm_task_queue in (None, workflow.info().task_queue):
            sliced, pre, retried = await self._slice_and_tune(inp)
        elif inp.shape >= ONE_LLM_ACTIVITY_SHAPE:
            sliced, pre, retried = await self._slice_and_tune_activity(inp)
        else:
            sliced = await self._slice(inp)
        usage["slice"] = sliced.usage
        now = workflow.now().timestamp()
        fragments = build_fragments(inp, sliced.drafts, now)
        themes = ordered_themes(fragments)
        self._theme = themes[0] if themes else None
        # Tuning needs only the drafts, so it runs before the store step, which then does
        # index, select and publish in one local activity.
        tuned_new, tune_usage = await self._tune_missing(inp, fragments, pre, retried)
        if tune_usage.calls:
            usage["tune"] = tune_usage
        select = self._select_input(inp, fragments, {**self._looked_up, **tuned_new})
        skeleton = InjectedContext(
            user_id=inp.user_id,
            version=inp.context_version + 1,
            generated_at=workflow.now().timestamp(),
            profile=inp.profile,
            watermarks=inp.watermarks_after,
            top_k=inp.config.top_k,
            forget_epoch=inp.epoch or 0,
        )
        # Shape 3: contents the round or the user workflow already hold are not sent back.
        held = [full_id(inp.user_id, i) for i in inp.known_fragments]
        known = [*held, *(f.id for f in fragments)] if slim else None
        by_ref = inp.shape >= BY_REFERENCE_SHAPE
        stored = await store_round(
            StoreRoundInput(
                fragments=fragments,
                select=select,
                context=skeleton,
                known=known,
                contents_top=inp.config.top_k if by_ref else None,
                known_from_round=inp.held_from_round if by_ref else 0,
                sweep_rounds=inp.sweep_rounds,
                epoch=inp.epoch,
                new_weights={k: pack_params(p) for k, p in tuned_new.items()}
                if self._lookup_user
                else {},
            ),
            f"index {len(fragments)} fragments, select, publish v{skeleton.version}",
        )
        stored_ids = set(stored.indexed)  # the store step skips repeats: they are not stored
        refs = [
            FragmentRef(id=f.id, created_at=f.created_at, seq=inp.first_seq + i)
            for i, f in enumerate(fragments)
            if f.id in stored_ids
        ]
        selection = SelectionLog(
            at=select.now, theme=select.theme, params_source=select.params_source
        )
        # The profile came from the user workflow, which puts it back: not sent twice.
        if slim:
            # Only contents the user workflow lacks; the picked lines of the scoring log are in
            # the store step's marker only.
            contents, ranked = _unknown_contents(inp, fragments, stored), stored.ranked
        else:
            contents, ranked = stored.fragments, None
            selection = selection.model_copy(update={"candidates": stored.picked})
        made = None
        if by_ref:  # every fragment the round stored reaches the user workflow with its contents
            sent = {c.id for c in contents}
            made = [ContextFragment.of(f) for f in fragments if f.id in stored_ids - sent]
        return RoundResult(
            round_no=inp.round_no,
            fragments=refs,
            themes=themes,
            tuned_new=tuned_new,
            context=skeleton.model_copy(update={"fragments": contents, "profile": UserProfile()}),
            selection=selection,
            usage=usage,
            ranked=ranked,
            by_reference=by_ref,
            made=made,
            swept_rounds=stored.swept_rounds,
            swept_rows=stored.swept_rows,
        )

    # --- the classic shape (shape 1: rounds recorded before the lean one) ----------------

    async def _run(self, inp: RoundInput) -> RoundResult:
        usage: dict[str, LLMUsage] = {}
        sliced = await self._slice(inp)
        usage["slice"] = sliced.usage
        fragments = build_fragments(inp, sliced.drafts, workflow.now().timestamp())
        if fragments:
            await workflow.execute_activity(
                ActivityName.INDEX,
                IndexInput(fragments=fragments, epoch=inp.epoch),
                result_type=IndexOutput,
                **store_activity(f"index {len(fragments)} fragments", heartbeat=STORE_HEARTBEAT),
            )
        themes = ordered_themes(fragments)
        if themes and inp.search_attributes:
            upsert_round_attributes(theme=themes[0])
        tuned_new, tune_usage = await self._tune_missing(inp, fragments)
        if tune_usage.calls:
            usage["tune"] = tune_usage
        selection = await self._select(inp, fragments, tuned_new)
        context = InjectedContext(
            user_id=inp.user_id,
            version=inp.context_version + 1,
            generated_at=workflow.now().timestamp(),
            profile=inp.profile,
            fragments=selection.fragments,
            watermarks=inp.watermarks_after,
            top_k=inp.config.top_k,
        )
        await publish_context(context)
        return RoundResult(
            round_no=inp.round_no,
            fragments=[
                FragmentRef(id=f.id, created_at=f.created_at, seq=inp.first_seq + i)
                for i, f in enumerate(fragments)
            ],
            themes=themes,
            tuned_new=tuned_new,
            context=context,
            selection=selection.log,
            usage=usage,
        )

    async def _slice(self, inp: RoundInput, attempts_before: int = 0) -> SliceOutput:
        return await workflow.execute_activity(
            ActivityName.SLICE,
            SliceInput(user_id=inp.user_id, turns=inp.turns, attempts_before=attempts_before),
            result_type=SliceOutput,
            **llm_activity(f"slice {len(inp.turns)} turns", inp.llm_task_queue),
        )

    async def _slice_and_tune(
        self, inp: RoundInput
    ) -> tuple[SliceOutput, dict[str, TuneOutput], int]:
        """Shape 3's LLM calls as one local attempt (one marker): slice, then tune the themes
        not cached. If it fails or runs past LOCAL_LLM_BOUND, the slice goes on as the ordinary
        activity (after the delay a 429 asked for), and the tunes after it. Returns the slice,
        the tunes made, and the failed attempts the remaining tunes count as made."""
        local = SliceTuneInput(
            slice=SliceInput(user_id=inp.user_id, turns=inp.turns),
            cached=list(inp.tuned),
            tune_budget_s=local_tune_budget_s(),
            lookup_user=self._lookup_user,
        )
        summary = f"slice {len(inp.turns)} turns, tune new themes"
        out, delay = await try_local(
            SLICE_AND_TUNE, local, SliceTuneOutput, llm_local_activity(summary)
        )
        if out is not None:
            self._looked_up = {k: unpack_params(v) for k, v in out.looked_up.items()}
            return out.sliced, out.tuned, int(out.tune_failed)
        await wait_out(SLICE_AND_TUNE, delay)
        # The local attempt failed: it counts toward the malformed-output limit.
        return await self._slice(inp, attempts_before=1), {}, 0

    async def _slice_and_tune_activity(
        self, inp: RoundInput
    ) -> tuple[SliceOutput, dict[str, TuneOutput], int]:
        """Shape 6 on an LLM queue of its own: the slice, the weights lookup and the tunes of
        the themes still missing as one ordinary activity there (its queue-wide rate limit
        holds; retried for hours like every LLM activity, heartbeating, its attempts visible).
        The activity never fails once its slice succeeded: a tune that failed or ran out of
        its budget is left to the round, which makes it as a tune activity."""
        step = SliceTuneInput(
            slice=SliceInput(user_id=inp.user_id, turns=inp.turns),
            cached=list(inp.tuned),
            tune_budget_s=activity_tune_budget_s(),
            lookup_user=self._lookup_user,
        )
        out = await workflow.execute_activity(
            SLICE_AND_TUNE,
            step,
            result_type=SliceTuneOutput,
            **llm_activity(f"slice {len(inp.turns)} turns, tune new themes", inp.llm_task_queue),
        )
        self._looked_up = {k: unpack_params(v) for k, v in out.looked_up.items()}
        return out.sliced, out.tuned, int(out.tune_failed)

    async def _tune_missing(
        self,
        inp: RoundInput,
        fragments: list[Fragment],
        pre: dict[str, TuneOutput] | None = None,
        attempts_before: int = 0,
    ) -> tuple[dict[str, TunedParams], LLMUsage]:
        """Tune only themes the user workflow's cache does not hold (the cache is per theme);
        `pre`: tunes the local slice-and-tune step already made."""
        tuned: dict[str, TunedParams] = {}
        total = LLMUsage()
        for key, out in (pre or {}).items():
            tuned[key] = out.params
            total = total + out.usage
        looked = getattr(self, "_looked_up", {})
        lookup = getattr(self, "_lookup_user", "")
        for key, request in tune_requests(fragments, {*inp.tuned, *tuned, *looked}):
            update: dict[str, Any] = {"attempts_before": attempts_before}
            if lookup:  # shape 5: the activity answers with stored weights when it has them
                update["lookup_user"] = lookup
            out = await workflow.execute_activity(
                ActivityName.TUNE,
                request.model_copy(update=update),
                result_type=TuneOutput,
                **llm_activity(f"tune theme {request.theme[:60]}", inp.llm_task_queue),
            )
            if out.cached:
                looked[key] = out.params
                continue
            tuned[key] = out.params
            total = total + out.usage
        return tuned, total

    async def _select(
        self, inp: RoundInput, fragments: list[Fragment], tuned_new: dict[str, TunedParams]
    ) -> SelectOutput:
        return await workflow.execute_activity(
            ActivityName.SELECT,
            self._select_input(inp, fragments, tuned_new),
            result_type=SelectOutput,
            **store_activity("select fragments"),
        )

    @staticmethod
    def _select_input(
        inp: RoundInput, fragments: list[Fragment], tuned_new: dict[str, TunedParams]
    ) -> SelectInput:
        """Select for the latest turns with the weights of the round's last theme."""
        theme = fragments[-1].theme if fragments else ""
        key = theme_key(theme)
        params = tuned_new.get(key) or cached_params(inp.tuned, key)
        return SelectInput(
            user_id=inp.user_id,
            query=query_text(inp),
            theme=theme,
            params=params or TunedParams(),
            params_source=f"tuned:{key}" if params else "default",
            config=inp.config,
            now=workflow.now().timestamp(),
        )


async def store_round(inp: StoreRoundInput, summary: str) -> StoreRoundOutput:
    """The store step: a local activity first (one marker event when the stores answer); when
    it has not succeeded within LOCAL_STORE_BOUND, the same idempotent step as an ordinary
    activity, which heartbeats and retries for the store bound, visible in the Temporal UI with
    its attempts and last failure while a store is down."""
    return await local_store_step(
        STORE_ROUND, inp, StoreRoundOutput, summary, heartbeat=STORE_HEARTBEAT
    )


async def local_store_step(
    name: str, arg: Any, result_type: type[T], summary: str, heartbeat: timedelta | None = None
) -> T:
    """An idempotent step on the stores: a local activity first, then (its local attempt
    failed or ran past LOCAL_STORE_BOUND) the same step as an ordinary activity retried for the
    store bound, with its attempts visible in the Temporal UI."""
    out, _ = await try_local(name, arg, result_type, store_local_activity(summary))
    if out is not None:
        return out
    return await workflow.execute_activity(
        name, arg, result_type=result_type, **store_activity(summary, heartbeat=heartbeat)
    )


async def try_local(
    name: str, arg: Any, result_type: type[T], options: dict[str, Any]
) -> tuple[T | None, timedelta | None]:
    """Run a step as a local activity (its success is one marker event): its result, or None
    when the local attempts failed or ran out of their bound, with the delay the failure asked
    for (an LLM's 429 with Retry-After). The caller then runs the step as an ordinary
    activity, which retries durably and shows its attempts in the Temporal UI; a success is
    never repeated, since the ordinary activity runs only after a failure. A permanent error or
    a cancellation ends here."""
    try:
        result = await workflow.execute_local_activity(
            name, arg, result_type=result_type, **options
        )
    except FailureError as err:
        # A failed local activity surfaces as ActivityError or as its cause (an
        # ApplicationError, a TimeoutError): a permanent error or a cancellation ends here.
        cause = err.cause if isinstance(err, ActivityError) else err
        if isinstance(cause, CancelledError) or (
            isinstance(cause, ApplicationError) and cause.non_retryable
        ):
            raise
        return None, cause.next_retry_delay if isinstance(cause, ApplicationError) else None
    return result, None


async def wait_out(name: str, delay: timedelta | None) -> None:
    """Wait the delay a failed attempt asked for (a 429's Retry-After) on a durable timer, so
    the provider is not asked again at once."""
    if delay is not None and delay > timedelta(0):
        await workflow.sleep(delay, summary=f"{name}: wait as the failed attempt asked")


def _unknown_contents(
    inp: RoundInput, fragments: list[Fragment], stored: StoreRoundOutput
) -> list[ContextFragment]:
    """The published fragments whose contents the user workflow does not hold: the round's
    own (it made them) and any the store step sent back; the others, held in its context or
    made by a round it vouches for (`held_from_round`), travel by id (`RoundResult.ranked`)."""
    known = {full_id(inp.user_id, i) for i in inp.known_fragments}
    own = {f.id: f for f in fragments}
    sent = {c.id: c for c in stored.fragments}
    out: list[ContextFragment] = []
    for ref in stored.ranked:
        fid = full_id(inp.user_id, ref.id)
        if fid in own:
            out.append(ContextFragment.of(own[fid], ref.score))
        elif fid in sent and fid not in known:
            out.append(sent[fid])
    return out


async def publish_context(
    context: InjectedContext, contents_top: int = 0, **bounds: Any
) -> PublishOutput:
    """Write the read model (shared by rounds and the user workflow); `bounds` go to
    `store_activity` (a best-effort publish gives up sooner). `contents_top`: return the
    contents of the stubs filled among the first this many (the user workflow's top_k)."""
    return await workflow.execute_activity(
        ActivityName.PUBLISH,
        PublishInput(context=context, contents_top=contents_top),
        result_type=PublishOutput,
        **store_activity(
            f"publish context v{context.version}", start_to_close=PUBLISH_START_TO_CLOSE, **bounds
        ),
    )


def build_fragments(inp: RoundInput, drafts: list[FragmentDraft], now: float) -> list[Fragment]:
    """Turn validated drafts into stored fragments with business-id keys and source positions.

    A fragment is as old as the newest message it came from: maturity for induction measures
    how long ago something was said, not when a worker got round to slicing it.
    """
    out: list[Fragment] = []
    last = len(inp.turns) - 1
    for i, draft in enumerate(drafts):
        lo = min(max(draft.start_idx, 0), last)
        hi = min(max(draft.end_idx, lo), last)
        source = inp.turns[lo : hi + 1]
        created = min(now, max(t.time for t in source))
        out.append(
            Fragment(
                id=fragment_id(inp.user_id, inp.round_no, i),
                user_id=inp.user_id,
                theme=draft.theme,
                types=list(draft.types),
                content=draft.content,
                created_at=created,
                reinforced_at=created,
                round_no=inp.round_no,
                thread_id=inp.thread_id,
                start_pos=source[0].position,
                end_pos=source[-1].position + 1,
                notes=list(draft.notes),
            )
        )
    return out


def query_text(inp: RoundInput) -> str:
    """The selection query: the latest turns of the batch, human words first."""
    recent = inp.turns[-QUERY_TURNS:]
    human = [t.content for t in recent if t.role == "human" and t.content]
    other = [t.content for t in recent if t.role != "human" and t.content]
    return "\n".join(human + other)[:QUERY_CHARS]


__all__ = ["MemoryRoundWorkflow", "build_fragments", "publish_context", "query_text"]
