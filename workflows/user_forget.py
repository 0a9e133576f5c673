"""Forgetting a user: a saga the main loop of UserMemoryWorkflow runs before anything else.

The forget update only records the request (and cancels the running round); the loop then waits
for in-flight writes, clears the state, deletes the fragments and the read model, retires the
user's data keys and keeps a receipt, which the update returns. It leaves nothing a later round
could resurrect. After retiring keys the run continues as new: the new run's history is sealed
with a new key, and it destroys the retired ones before anything else (`shred_retired`;
crypto-shredding, docs/PRIVACY.md). Destroying them in the forgotten run itself left a gap: a
worker that lost the run from its cache before the continue-as-new had to replay a history it
could no longer decode, and the workflow stayed stuck on KeyDestroyedError.

A store outage never fails the user workflow (which would lose its state to a fresh run): each
store step is retried on a durable timer until it succeeds; meanwhile `status` shows the forget
as pending and the caller's update waits for the receipt.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.contracts import (
        ActivityName,
        DeleteFragmentsInput,
        DeleteFragmentsOutput,
        DeleteReadModelInput,
        DeleteReadModelOutput,
        ForgetReceipt,
        ForgetRequest,
    )
    from mnemoflow.models.profile import profile_facts
    from mnemoflow.models.user_keys import (
        DESTROY_USER_KEY,
        RETIRE_USER_KEY,
        DestroyUserKeyInput,
        DestroyUserKeyOutput,
        RetireUserKeyInput,
        RetireUserKeyOutput,
    )
    from mnemoflow.workflows import state_ops
    from mnemoflow.workflows.options import failure_text, store_activity
    from mnemoflow.workflows.user_state import UserRun, absorb, absorb_requests

#: Patch id of the crypto-shredding step (histories of forgets before it replay without it).
SHRED_KEYS = "forget-shreds-user-keys-1"
#: Patch id of retiring the keys in the forgotten run and destroying them in the next one
#: (histories from before it destroyed them in the forgotten run).
SHRED_AFTER_CONTINUE = "forget-destroys-keys-after-continue-as-new"
HISTORIES_SHREDDED = (
    "this user's workflow and round histories stay in Temporal until the namespace's retention "
    "ends; their payloads are sealed with the destroyed key and cannot be read"
)
HISTORIES_READABLE = (
    "this user's workflow and round histories stay in Temporal, readable, until the namespace's "
    "retention ends (no encryption keys configured: docs/PRIVACY.md)"
)
#: After a store step of the forget gave up (its own retries over), wait this long and try again.
FORGET_RETRY = timedelta(minutes=5)


async def forget(run: UserRun, req: ForgetRequest) -> ForgetReceipt:
    """Ask the loop to forget the user (once, however often asked) and wait for its receipt."""
    if run.forget_request is None:
        run.forget_receipt = None
        run.forget_request = req
        if run.round_task is not None and not run.round_task.done():
            run.round_task.cancel()
    await workflow.wait_condition(lambda: run.forget_receipt is not None)
    assert run.forget_receipt is not None
    return run.forget_receipt


#: The forget lifts the back-off of failed rounds (histories from before it replay as they ran).
FORGET_CLEARS_BACKOFF = "forget-clears-backoff"
#: A forget counts a new forget epoch: the stores refuse every write asked for before it, and
#: messages stamped with an older epoch are refused whatever their time (docs/ARCHITECTURE.md,
#: "Forget epochs"). Histories from before fenced by time only.
FORGET_EPOCH = "forget-epochs"


async def maybe_forget(run: UserRun) -> bool:
    """Run the saga if a forget was requested; True when it ran."""
    req = run.forget_request
    if req is None:
        return False
    await workflow.wait_condition(lambda: run.writes_in_flight == 0)
    absorb_requests(run)
    facts = len(profile_facts(run.state.profile))
    dropped = state_ops.forget_all(run.state, clear_backoff=run.patched(FORGET_CLEARS_BACKOFF))
    # The fence: a message said before the forget and delivered late (a writer that was cut
    # off, a re-send from a checkpointer) is refused, never indexed again. By its forget epoch
    # when the agent stamped one, else by its time.
    run.state.fence = max(run.state.fence, workflow.now().timestamp())
    epoch: int | None = None
    if run.epoch_rule is None:
        run.epoch_rule = run.patched(FORGET_EPOCH)
    if run.epoch_rule:
        run.state.forget_epoch += 1
        epoch = run.state.forget_epoch
    user_id = run.inp.user_id
    # The store moves the user's epoch record before it deletes: a write asked for before the
    # forget (a round it cancelled whose write is still under way) is refused from then on.
    fragments = await _until_done(
        run,
        ActivityName.DELETE_FRAGMENTS,
        DeleteFragmentsInput(user_id=user_id, epoch=epoch),
        DeleteFragmentsOutput,
        "forget: delete fragments",
    )
    read_model = await _until_done(
        run,
        ActivityName.DELETE_READ_MODEL,
        DeleteReadModelInput(user_id=user_id, epoch=epoch),
        DeleteReadModelOutput,
        "forget: delete read model",
    )
    # Last store step: the user's data keys, so no payload of theirs Temporal keeps (histories
    # until their retention, copies of the database) can be decrypted again. Retired here and
    # destroyed by the run this one continues as (its history needs none of them).
    keys = DestroyUserKeyOutput(destroyed=0)
    retired: list[str] = []
    if run.patched(SHRED_AFTER_CONTINUE):
        if req.keys:
            retired = (
                await _until_done(
                    run,
                    RETIRE_USER_KEY,
                    RetireUserKeyInput(user_id=user_id),
                    RetireUserKeyOutput,
                    "forget: retire the user's data keys",
                )
            ).generations
            run.state.shred = list(retired)
    elif run.patched(SHRED_KEYS):
        keys = await _until_done(
            run,
            DESTROY_USER_KEY,
            DestroyUserKeyInput(user_id=user_id),
            DestroyUserKeyOutput,
            "forget: destroy the user's data keys",
        )
    cancelled, run.rounds_cancelled = run.rounds_cancelled, 0
    run.remembered_during_round.clear()
    receipt = ForgetReceipt(
        user_id=user_id,
        at=workflow.now().timestamp(),
        fragments_deleted=fragments.deleted,
        read_model_deleted=read_model.deleted,
        profile_cleared=True,
        events_dropped=dropped,
        rounds_cancelled=cancelled,
        reason=req.reason,
        keys_destroyed=keys.destroyed,
        profile_facts_removed=facts,
        fence=run.state.fence,
        epoch=run.state.forget_epoch,
        histories=HISTORIES_SHREDDED if keys.destroyed or retired else HISTORIES_READABLE,
        keys_pending=len(retired),
    )
    state_ops.keep_receipt(run.state, receipt)
    run.forget_receipt = receipt
    run.forget_request = None
    if keys.destroyed or retired:
        await _continue_past_shredded_history(run)
    return True


#: How long the run a forget continued as waits before it destroys the retired keys: a
#: hand-over encoded with them just before the retire and still in flight lands meanwhile, and
#: still decodes.
SHRED_GRACE = timedelta(seconds=1)


async def shred_retired(run: UserRun) -> None:
    """Destroy the data key generations the forget of the previous run retired (first thing in
    a run that carries any); the kept receipt then counts them as destroyed. Then this run
    continues as new too: a payload sealed with a retired key may have reached it during the
    grace, and no history that a worker may replay later may hold one."""
    if not run.state.shred:
        return
    await workflow.sleep(SHRED_GRACE, summary="grace before the retired keys are destroyed")
    out = await _until_done(
        run,
        DESTROY_USER_KEY,
        DestroyUserKeyInput(user_id=run.inp.user_id, generations=list(run.state.shred)),
        DestroyUserKeyOutput,
        "forget: destroy the retired data keys",
    )
    run.state.shred = []
    receipts = run.state.forget_receipts
    if receipts:
        last = receipts[-1]
        receipts[-1] = last.model_copy(
            update={"keys_destroyed": last.keys_destroyed + out.destroyed, "keys_pending": 0}
        )
    await _continue_past_shredded_history(run)


async def shredded(run: UserRun) -> ForgetReceipt | None:
    """The last forget's receipt once the keys it retired are destroyed (None: no forget)."""
    await workflow.wait_condition(lambda: not run.state.shred)
    return run.state.forget_receipts[-1] if run.state.forget_receipts else None


async def _until_done(run: UserRun, name: str, arg: Any, result_type: type, what: str) -> Any:
    """Run a store step of the forget until it succeeds: past its retry bound, record the forget
    as pending (status shows it) and try again after FORGET_RETRY, never failing the workflow."""
    while True:
        try:
            return await workflow.execute_activity(
                name, arg, result_type=result_type, **store_activity(what)
            )
        except ActivityError as err:
            run.state.last_error = f"forget pending: {what} failed: {failure_text(err)}"
            await workflow.sleep(FORGET_RETRY, summary=f"{what}: retry")


async def _continue_past_shredded_history(run: UserRun) -> None:
    """Continue as new once the receipt is returned: this run's history holds payloads sealed
    with the retired key, which the new run destroys (a replay of this run after that would
    fail); the new run starts from the forgotten state, sealed with a new key."""
    await workflow.wait_condition(workflow.all_handlers_finished)
    absorb(run, workflow.now().timestamp())
    run.state.continued += 1
    workflow.continue_as_new(run.continued_input())
