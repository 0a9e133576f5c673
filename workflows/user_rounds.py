"""The round step of UserMemoryWorkflow's loop: run the due thread's round as a child workflow.

The user workflow owns every piece of state; a round gets its turns, the config and the caches
as input and hands back fragments, tuned parameters and the published context. A failed round
keeps its turns pending (with a back-off); a round cancelled by forget is counted for the receipt.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ChildWorkflowHandle

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.contracts import (
        ActivityName,
        ContextFragment,
        DeleteFragmentsInput,
        DeleteFragmentsOutput,
        InjectedContext,
        RankedRef,
        RoundInput,
        RoundRecord,
        RoundResult,
        SweptRow,
        Watermark,
        is_stub,
        stub_fragment,
    )
    from mnemoflow.models.ids import round_workflow_id
    from mnemoflow.models.round_store import (
        STORED_FLOOR,
        StoredFloorInput,
        StoredFloorOutput,
        full_id,
        held_by_round,
        pack_params,
        pack_theme_cache,
        short_id,
    )
    from mnemoflow.models.turns import ChatTurn
    from mnemoflow.workflows import state_ops
    from mnemoflow.workflows.memory_round import (
        QUIET_COMPLETION_SHAPE,
        MemoryRoundWorkflow,
        local_store_step,
        publish_context,
    )
    from mnemoflow.workflows.options import (
        ROUND_TASK_TIMEOUT,
        STORE_HEARTBEAT,
        failure_text,
        round_search_attributes,
        store_activity,
    )
    from mnemoflow.workflows.remembered import REMEMBER_PUBLISH_BOUND, with_remembered
    from mnemoflow.workflows.user_state import UserRun

MAX_ROUND_ID_PROBES = 24
#: The shape of the rounds this code starts (workflows/memory_round.py): 7, lean with local
#: LLM attempts, the contents of earlier fragments by reference, the theme weights looked up
#: in Redis, with an LLM queue of their own one LLM activity a round (slice, lookup, missing
#: tunes), and no search attributes written when the round completes. It travels in the
#: round's input, so rounds started by older code replay their own.
ROUND_SHAPE = 7
#: Shape 3 sends the theme cache packed (weights as lists, not named fields) and rounded to this
#: many places: a third of its bytes in the round's input; the scores move by less than 1e-5.
TUNED_PLACES = 6
#: A round takes at most this many bytes of turns (JSON, as they travel). Its input, its slice's
#: marker and its store step each carry about that much, and Temporal refuses a payload over
#: 2 MB: a workflow task that would write one fails at every attempt, and the round with it.
#: `max_turns_per_round` alone did not bound it (64 parts of 8,000 emoji are 2 MB; a model with a
#: window of a million tokens lets the ceiling wait that long). A single turn is at most
#: `middleware.payloads.MAX_TURN_BYTES` (256 KB), so a round always takes at least one.
ROUND_MAX_BYTES = 512_000
#: Rounds bounded in bytes start where this patch is recorded; older histories replay their
#: batches whole (a batch over the bound failed every task there, so none completed).
ROUND_BYTES_PATCH = "round-bytes-bound"
#: Facts remembered during a round are republished without what was forgotten meanwhile.
REMEMBERED_SKIPS_FORGOTTEN = "remembered-skips-forgotten"
#: A round during which this workflow published completes with its selection published
#: again above that (Redis refused the round's own publish, histories from before left it).
ROUND_REPUBLISHED = "round-republished-after-newer"
#: Rounds whose swept rows this run keeps (UserRun.swept_rows; histories before
#: SWEEP_READS_FIRST).
SWEPT_ROUNDS_KEPT = 8
#: Before a round that sweeps failed rounds' rows starts, the workflow reads those rows and
#: keeps what a forget needs of them in its state (UserMemoryState.swept_rows): a forget that
#: comes after the sweep finds their lines in a later run, after a sweeping round that failed
#: too, and after their round left the thread's list (docs/ARCHITECTURE.md, "The round").
SWEEP_READS_FIRST = "sweep-reads-rows-first"
#: A round the store refused as of an older forget epoch than the user's record, with no forget
#: of this workflow under way (a fresh history that could not read the record at its start):
#: the workflow takes the record's epoch and the thread's next round goes at once.
ROUND_TAKES_STORED_EPOCH = "round-takes-stored-epoch"


async def number_above_stored(run: UserRun) -> None:
    """A fresh history (a new user, or one whose workflow history is gone while the stores
    still hold its memory, e.g. under a new workflow id) numbers its rounds above the highest
    stored round, since fragment ids derive from round numbers (an earlier history's rows were
    overwritten, and vouched for as `recent`), and its contexts above the one Redis holds
    (whose newer version refused every publish). Best effort: a failure keeps the old start."""
    s = run.state
    inp = StoredFloorInput(user_id=run.inp.user_id)
    try:
        out = await local_store_step(STORED_FLOOR, inp, StoredFloorOutput, "what is stored already")
    except FailureError as err:
        if isinstance(err, CancelledError):
            raise
        s.last_error = f"reading what is stored failed: {failure_text(err)}"
        return
    s.rounds_started = max(s.rounds_started, out.round_no)
    s.context_floor = max(s.context_floor, out.context_version)
    # An earlier history's forgets: its epoch record refuses every write of an older epoch.
    s.forget_epoch = max(s.forget_epoch, out.forget_epoch)


async def maybe_round(run: UserRun) -> bool:
    """Run the round of the thread that is due first, if any; True when something ran."""
    s, cfg = run.state, run.config
    now = workflow.now().timestamp()
    thread_id = state_ops.due_thread(s, cfg, now, run.held_threads)
    if thread_id is None:
        return False
    ts = s.threads[thread_id]
    batch = within_round_bytes(run, state_ops.round_batch(ts, cfg.max_turns_per_round))
    start, end = ts.indexed, ts.indexed + len(batch)  # ordinals of the thread's indexed messages
    after = state_ops.round_watermarks(s, thread_id, batch)
    record = RoundRecord(
        round_no=0,
        workflow_id="",
        event_id=f"{thread_id}:{start}-{end}",
        thread_id=thread_id,
        start=start,
        end=end,
        trigger=ts.trigger,
        started_at=now,
    )
    # Facts remembered from here on may be missing from this round's selection.
    run.remembered_during_round.clear()
    # Contents a round does not resend: its selection's and those of the latest rounds' fragments.
    held = {f.id: f for f in [*s.recent, *run.context().fragments]}
    base = run.round_base = run.context().version
    run.round_record = record
    try:
        sweeping = await _read_before_sweep(run, thread_id)
        handle = await _start_round(run, record, batch, after, sweeping)
        run.round_task = handle
        result = await handle
    except (ChildWorkflowError, ApplicationError) as err:
        started = run.round_task is not None  # not when no round number was free
        run.round_record = None
        if run.forget_request is not None:  # the forget cancelled it: count it in the receipt
            state_ops.round_failed(s, record, "cancelled by forget", now, cfg, started, batch)
            run.rounds_cancelled += 1
            return True
        state_ops.round_failed(s, record, failure_text(err), now, cfg, started, batch)
        if _stale_epoch(err) and run.patched(ROUND_TAKES_STORED_EPOCH):
            behind = s.forget_epoch
            await number_above_stored(run)
            if s.forget_epoch > behind:  # else the back-off holds (no loop of refused rounds)
                s.threads[record.thread_id].not_before = 0.0
        return True
    except asyncio.CancelledError:
        run.round_record = None
        if run.forget_request is None:
            raise  # the user workflow itself is being cancelled
        started = run.round_task is not None
        state_ops.round_failed(s, record, "cancelled by forget", now, cfg, started, batch)
        run.rounds_cancelled += 1
        return True
    finally:
        run.round_task = None
        run.round_base = None
    floor = run.context().version
    # Published meanwhile (a forget, a remember) above the version the round published: Redis
    # refused the round's context, which may name a fragment forgotten meanwhile. The round's
    # selection goes out above what was published (below), without what was forgotten.
    newer_meanwhile = floor > base
    # A fragment whose forget is still under way is kept: the forget takes it out when it is
    # done, and if the forget fails the fragment stays stored, and kept, as its round says.
    state_ops.keep_made(s, run.inp.user_id, record.round_no, result, set(s.forgotten_fragments))
    # A lean round leaves the profile (its own input) out of its result: put it back.
    result.context = with_contents(
        result.context,
        result.ranked,
        held,
        run.context(),
        run.inp.user_id,
        by_reference=result.by_reference,
    )
    update: dict[str, object] = {"profile": s.profile}
    if newer_meanwhile:
        update["version"] = max(result.context.version, floor + 1)
    result.context = result.context.model_copy(update=update)
    state_ops.round_completed(s, record, result, batch, workflow.now().timestamp(), run.inp.prices)
    if result.swept_rows:  # a forget of one of them that comes later finds its lines here
        run.swept_rows[record.round_no] = list(result.swept_rows)
        for old in sorted(run.swept_rows)[:-SWEPT_ROUNDS_KEPT]:
            del run.swept_rows[old]
    run.round_record = None
    published = await _keep_remembered(run, floor)
    published = await drop_forgotten(run) or published
    if newer_meanwhile and not published and run.patched(ROUND_REPUBLISHED):
        await publish_held(run)
    return True


def _stale_epoch(err: BaseException) -> bool:
    """Whether a round failed because the store refused its write as of an older forget epoch
    (models.errors.StaleEpochError, docs/ARCHITECTURE.md "Forget epochs")."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.type == "StaleEpoch":
            return True
        cause = cause.__cause__ if not isinstance(cause, FailureError) else cause.cause
    return False


def within_round_bytes(run: UserRun, batch: list[ChatTurn]) -> list[ChatTurn]:
    """The oldest turns of the batch that fit ROUND_MAX_BYTES (at least one); the rest stay
    pending for the next round. The patch is asked only when the bound cuts something."""
    size = 0
    for count, turn in enumerate(batch):
        size += len(turn.model_dump_json().encode("utf-8"))
        if size > ROUND_MAX_BYTES and count > 0:
            return batch[:count] if run.patched(ROUND_BYTES_PATCH) else batch
    return batch


def with_contents(
    context: InjectedContext,
    ranked: list[RankedRef] | None,
    held: dict[str, ContextFragment],
    current: InjectedContext,
    user_id: str,
    by_reference: bool = False,
) -> InjectedContext:
    """A shape-3 round names its published fragments by id and score (`ranked`) and sends only
    the contents this workflow did not hold: put the selection together again, in its order.
    An id held nowhere any more was forgotten meanwhile and stays out. A shape-4 round
    (`by_reference`) sends its own fragments' contents and those of the first `top_k` that this
    workflow lacks: an id held nowhere is one that came back into the selection further down,
    held from now on as a stub (the publish activity fills it; a later round that ranks it
    among the first `top_k` sends its content)."""
    if ranked is None:
        return context  # shapes 1 and 2 send the whole selection
    have: dict[str, ContextFragment] = {}
    for f in [*held.values(), *current.fragments, *context.fragments]:
        if f.id not in have or not is_stub(f):  # a content, once at hand, replaces a stub
            have[f.id] = f
    fragments = []
    for ref in ranked:
        fid = full_id(user_id, ref.id)
        if fid in have:
            fragments.append(have[fid].model_copy(update={"score": ref.score}))
        elif by_reference:
            fragments.append(stub_fragment(fid, ref.score))
    return context.model_copy(update={"fragments": fragments})


async def publish_held(run: UserRun) -> bool:
    """Publish the context the user workflow holds (best effort, bounded) and take in the
    contents of the stubs the publish filled among the first `top_k`, so that the workflow's
    own answer (the hot path's fallback) injects what Redis does, also after a forget moved
    stubs up. While a round runs, the version goes above the one that round publishes: its
    selection was read before this publish and may hold a fragment forgotten since, so Redis
    must refuse it (the loop publishes the round's selection, cleaned, when it completes).
    False when the publish failed (in `last_error`; the state still holds it)."""
    if run.state.context is None:
        return False
    if run.state.context.forget_epoch != run.state.forget_epoch:
        run.state.context = run.state.context.model_copy(
            update={"forget_epoch": run.state.forget_epoch}
        )
    if run.round_base is not None and run.state.context.version < run.round_base + 2:
        run.state.context = run.state.context.model_copy(update={"version": run.round_base + 2})
    try:
        out = await publish_context(
            run.state.context,
            contents_top=run.config.top_k,
            schedule_to_close=REMEMBER_PUBLISH_BOUND,
        )
    except ActivityError as err:
        run.state.last_error = f"publish failed: {failure_text(err)}"
        return False
    if run.state.context is not None:
        run.state.context = state_ops.with_filled(run.state.context, out.filled)
    return True


async def drop_forgotten(run: UserRun) -> bool:
    """A fragment forgotten while a round or an induction ran may be in what it published:
    take it out again and republish (best effort: the state holds the clean context). True
    when it published."""
    s = run.state
    if s.context is None or not s.forgotten_fragments:
        return False
    cleaned = state_ops.without_forgotten(s.context, s.forgotten_fragments, s.profile)
    if cleaned is s.context:
        return False
    s.context = cleaned
    await publish_held(run)
    return True


async def _keep_remembered(run: UserRun, floor: int) -> bool:
    """Re-publish facts remembered while the round ran: its selection could not see them.
    True when it published."""
    if not run.remembered_during_round:
        return False
    # What was forgotten while the round ran never goes out with it (drop_forgotten then finds
    # nothing left to take out: this publish is the clean one). Histories from before published
    # it and then published again without it.
    s = run.state
    context = run.context()
    cleaned = state_ops.without_forgotten(context, s.forgotten_fragments, s.profile)
    if cleaned is not context and run.patched(REMEMBERED_SKIPS_FORGOTTEN):
        context = cleaned
    for fragment in run.remembered_during_round:
        context = with_remembered(
            context,
            fragment,
            workflow.now().timestamp(),
            limit=run.config.published_candidates,
        )
    run.remembered_during_round.clear()
    run.state.context = context.model_copy(update={"version": max(context.version, floor + 1)})
    await publish_held(run)
    return True


async def _read_before_sweep(run: UserRun, thread_id: str) -> list[SweptRow]:
    """The rows of the thread's failed rounds, read and kept in the state before the round
    that sweeps them starts (SWEEP_READS_FIRST); a read that fails fails the round before it
    starts (it backs off): nothing is swept that the workflow has not kept."""
    failed = run.state.threads[thread_id].failed_rounds
    if not failed or not run.patched(SWEEP_READS_FIRST):
        return []
    try:
        out = await workflow.execute_activity(
            ActivityName.DELETE_FRAGMENTS,
            DeleteFragmentsInput(user_id=run.inp.user_id, ids=[], read_rounds=list(failed)),
            result_type=DeleteFragmentsOutput,
            **store_activity("read the failed rounds' rows", heartbeat=STORE_HEARTBEAT),
        )
    except ActivityError as err:
        raise ApplicationError(f"reading the rows to sweep failed: {failure_text(err)}") from err
    if run.forget_request is not None:  # came during the read: the round is not started
        raise ApplicationError("cancelled by forget")
    return state_ops.keep_swept_rows(run.state, thread_id, out.rows, set(failed))


async def _start_round(
    run: UserRun,
    record: RoundRecord,
    batch: list[ChatTurn],
    after: dict[str, Watermark],
    sweeping: list[SweptRow] | None = None,
) -> ChildWorkflowHandle[MemoryRoundWorkflow, RoundResult]:
    """Start the round child; a number already used (fresh history) is skipped, not reused.
    The kept rows it sweeps (`sweeping`) are marked as swept by it."""
    s = run.state
    parent_id = workflow.info().workflow_id
    step = 1
    for _ in range(MAX_ROUND_ID_PROBES):
        s.rounds_started += 1
        round_no = s.rounds_started
        record.round_no = round_no
        for row in sweeping or []:
            row.swept_by = round_no
        record.workflow_id = round_workflow_id(parent_id, round_no)
        try:
            handle = await workflow.start_child_workflow(
                MemoryRoundWorkflow.run,
                _round_input(run, record, batch, after),
                id=record.workflow_id,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                task_timeout=ROUND_TASK_TIMEOUT,
                search_attributes=_round_attributes(run, record),
                static_summary=(
                    f"user {run.display_user()}, round {round_no}, "
                    f"{len(batch)} messages, trigger {record.trigger}"
                ),
            )
        except WorkflowAlreadyStartedError:
            # A round of an earlier history had this number: its fragments were never seen here.
            state_ops.drop_recent(s)
            s.rounds_started += step - 1
            step *= 2
            continue
        state_ops.round_started(s, record)
        describe(run)
        return handle
    raise ApplicationError("no free round id", type="InvalidInput", non_retryable=True)


def _round_input(
    run: UserRun, record: RoundRecord, batch: list[ChatTurn], after: dict[str, Watermark]
) -> RoundInput:
    s, inp = run.state, run.inp
    shape = ROUND_SHAPE
    if shape == 5 and inp.llm_task_queue not in (None, workflow.info().task_queue):
        # Shape 5 on a queue of its own would look the weights up with a tune activity per
        # cached theme; as shape 4 the input carries them (shape 6 looks them up in its one
        # LLM activity).
        shape = 4
    slim = shape >= 3
    compact = shape == 4
    compact_refs = shape >= 4  # by reference: the rounds it vouches for (state_ops.keep_made)
    held = s.recent_from
    packed = {k: pack_params(p, TUNED_PLACES) for k, p in s.tuned.items()} if shape == 3 else {}
    return RoundInput(
        user_id=inp.user_id,
        round_no=record.round_no,
        event_id=record.event_id,
        thread_id=record.thread_id,
        turns=batch,
        trigger=record.trigger,
        first_seq=s.fragment_seq + 1,
        config=run.config,
        tuned={} if slim else s.tuned,
        tuned_packed=packed,
        tuned_compact=pack_theme_cache(s.tuned) if compact and s.tuned else "",
        profile=s.profile,
        watermarks_after=after,
        context_version=run.context().version,
        llm_task_queue=inp.llm_task_queue,
        search_attributes=inp.search_attributes,
        shape=shape,
        # What this workflow holds with contents (not its stubs): those are not sent back.
        known_fragments=[
            short_id(inp.user_id, f.id)
            for f in run.context().fragments
            if not is_stub(f) and not (compact_refs and held_by_round(inp.user_id, f.id, held))
        ]
        if slim
        else [],
        held_from_round=held if compact_refs else 0,
        sweep_rounds=list(s.threads[record.thread_id].failed_rounds),
        epoch=s.forget_epoch,
    )


def _round_attributes(run: UserRun, record: RoundRecord) -> TypedSearchAttributes | None:
    if not run.inp.search_attributes:
        return None
    return round_search_attributes(
        user=run.search_user(),
        round_no=record.round_no,
        trigger=record.trigger,
        # No `running`: a round of QUIET_COMPLETION_SHAPE that completes writes no outcome,
        # and would keep it; the execution's status says whether it runs.
        outcome=None if ROUND_SHAPE >= QUIET_COMPLETION_SHAPE else "running",
    )


def describe(run: UserRun) -> None:
    """The workflow's current details in the Temporal UI: what an operator looks at first."""
    s = run.state
    pending = sum(len(t.pending) for t in s.threads.values())
    marks = ", ".join(
        f"{k[:40]} {v.indexed}/{v.accepted}" for k, v in state_ops.watermarks(s).items()
    )
    workflow.set_current_details(
        f"rounds {s.rounds_completed} done, {s.rounds_failed} failed; "
        f"pending turns {pending}, pending events {len(run.submits)}; "
        f"indexed/accepted: {marks or '-'}; induction cursor {s.induction_cursor}; "
        f"last error: {s.last_error or '-'}"
    )
