"""Upkeep steps of UserMemoryWorkflow's loop: induction into the profile, reinforcement.

Both run in the main loop only (never in a handler), between rounds: induction when the oldest
un-inducted fragment reached the long-term gate, reinforcement once per model call that used
injected fragments.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.contracts import (
        ActivityName,
        FragmentRef,
        InductInput,
        InductOutput,
        ReinforceInput,
        ReinforceOutput,
    )
    from mnemoflow.models.errors import NON_RETRYABLE_TYPES
    from mnemoflow.workflows import state_ops
    from mnemoflow.workflows.memory_round import publish_context
    from mnemoflow.workflows.options import failure_text, llm_activity, store_activity
    from mnemoflow.workflows.user_rounds import drop_forgotten
    from mnemoflow.workflows.user_state import UserRun

MAX_INDUCTION_BATCH = 32


async def maybe_induct(run: UserRun) -> bool:
    """Fold the mature un-inducted fragments into the profile; True when something ran."""
    s, cfg = run.state, run.config
    now = workflow.now().timestamp()
    limit = s.induction_batch_limit or MAX_INDUCTION_BATCH
    batch = state_ops.mature_for_induction(s, cfg, now)[:limit]
    if not batch:
        return False
    # A forget taking lines out of rows (`rewriting`) goes first: an induction reading a row
    # before that and storing after would credit the row with a fact it no longer states.
    while run.rewriting:  # checked again on waking: the rewrite may have started first
        await workflow.wait_condition(lambda: not run.rewriting)
    run.inducting = True
    try:
        return await _induct(run, batch, now)
    finally:
        run.inducting = False


async def _induct(run: UserRun, batch: list[FragmentRef], now: float) -> bool:
    s, cfg = run.state, run.config
    try:
        out = await workflow.execute_activity(
            ActivityName.INDUCT,
            InductInput(
                user_id=run.inp.user_id,
                profile=s.profile,
                fragment_ids=[r.id for r in batch],
                list_limit=cfg.profile_list_limit,
            ),
            result_type=InductOutput,
            **llm_activity(f"induct {len(batch)} fragments", run.inp.llm_task_queue),
        )
    except ActivityError as err:
        s.last_error = f"induction failed: {failure_text(err)}"
        # A batch the model refuses for good (too long for its window, output it can never
        # make valid) would be refused again at every back-off: it shrinks instead.
        if _failed_for_good(err) and run.patched(INDUCTION_SHRINKS):
            state_ops.induction_refused(s, batch, s.last_error)
        else:
            s.induction_not_before = now + cfg.failed_round_backoff_s
        return True
    # Facts carry the fragments that state them; one forgotten while this ran never shows.
    by_statement = run.patched(INDUCTION_BY_STATEMENT)
    profile = state_ops.induced_profile(s, batch, out) if by_statement else out.profile
    try:
        # Store the merged profile first: the cursor never moves past an unstored profile.
        # A remember waits meanwhile, so the context it extends is this one, not the one before.
        run.publishing = True
        context = run.context().model_copy(
            update={
                "profile": profile,
                "version": run.context().version + 1,
                "generated_at": workflow.now().timestamp(),
                "watermarks": state_ops.watermarks(s),
            }
        )
        published = await publish_context(context, contents_top=run.config.top_k)
    except ActivityError as err:
        s.last_error = f"induction failed: {failure_text(err)}"
        s.induction_not_before = now + cfg.failed_round_backoff_s
        return True
    finally:
        run.publishing = False
    s.context = state_ops.with_filled(context, published.filled)
    state_ops.induction_stored(s, batch, out, run.inp.prices, by_statement=by_statement)
    state_ops.induction_grows(s, MAX_INDUCTION_BATCH)
    await drop_forgotten(run)
    return True


def _failed_for_good(err: ActivityError) -> bool:
    """The model refused what it was given (HTTP 400/413/422: too long for its window; output
    it could not make valid; a payload too large): a smaller batch may pass. Not an outage
    that outlasted its retries, nor a refused key or model (401/403/404), which every batch
    would meet: those back off as before."""
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type in NON_RETRYABLE_TYPES


async def maybe_reinforce(run: UserRun) -> bool:
    """Strengthen the fragments of the oldest queued model call; True when something ran."""
    s = run.state
    if not s.pending_reinforce:
        return False
    event = s.pending_reinforce.pop(0)
    # A fragment forgotten (or being forgotten) is never reinforced: the reinforce would write
    # its row back whole (ARCHITECTURE.md, "Forget leaves nothing to resurrect").
    gone = run.forgetting | set(s.forgotten_fragments)
    ids = [i for i in event.fragment_ids if i not in gone]
    if len(ids) < len(event.fragment_ids) and run.patched(REINFORCE_SKIPS_FORGOTTEN):
        if not ids:
            return True
    else:
        ids = event.fragment_ids
    # A forget taking lines out of rows goes first: a reinforce writes whole rows back.
    while run.rewriting:
        await workflow.wait_condition(lambda: not run.rewriting)
    run.reinforcing = True
    try:
        await workflow.execute_activity(
            ActivityName.REINFORCE,
            ReinforceInput(
                user_id=run.inp.user_id,
                call_id=event.call_id,
                fragment_ids=ids,
                now=workflow.now().timestamp(),
                epoch=run.state.forget_epoch,
            ),
            result_type=ReinforceOutput,
            **store_activity(f"reinforce {len(ids)} fragments"),
        )
    except ActivityError as err:
        s.last_error = f"reinforce failed: {failure_text(err)}"
    finally:
        run.reinforcing = False
    return True


#: Patch of the reinforce step that leaves forgotten fragments out (histories from before it
#: replay as they ran).
REINFORCE_SKIPS_FORGOTTEN = "reinforce-skips-forgotten"
#: Patch of the induction that credits each fact to the fragments that state it, and publishes
#: the profile without what was forgotten while it ran (histories from before replay as they ran).
INDUCTION_BY_STATEMENT = "induction-facts-by-statement"
#: Patch of the induction whose batch shrinks when the model refuses it for good.
INDUCTION_SHRINKS = "induction-batch-shrinks"
