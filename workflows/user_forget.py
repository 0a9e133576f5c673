"""Forgetting a user: a saga the main loop of UserMemoryWorkflow runs before anything else.

The forget update only records the request (and cancels the running round); the loop then waits
for in-flight writes, clears the state, deletes the fragments and the read model, destroys the
user's data keys (crypto-shredding, docs/PRIVACY.md) and keeps a receipt, which the update
returns. It leaves nothing a later round could resurrect. After destroying keys the run
continues as new, so no live history needs the destroyed key.
"""

from __future__ import annotations

from temporalio import workflow

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
    from mnemoflow.models.user_keys import (
        DESTROY_USER_KEY,
        DestroyUserKeyInput,
        DestroyUserKeyOutput,
    )
    from mnemoflow.workflows import state_ops
    from mnemoflow.workflows.options import store_activity
    from mnemoflow.workflows.user_state import UserRun, absorb, absorb_requests

#: Patch id of the crypto-shredding step (histories of forgets before it replay without it).
SHRED_KEYS = "forget-shreds-user-keys-1"


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


async def maybe_forget(run: UserRun) -> bool:
    """Run the saga if a forget was requested; True when it ran."""
    req = run.forget_request
    if req is None:
        return False
    await workflow.wait_condition(lambda: run.writes_in_flight == 0)
    absorb_requests(run)
    dropped = state_ops.forget_all(run.state)
    # The fence: a message said before the forget and delivered late (a writer that was cut
    # off, a re-send from a checkpointer) is refused, never indexed again.
    run.state.fence = max(run.state.fence, workflow.now().timestamp())
    user_id = run.inp.user_id
    fragments = await workflow.execute_activity(
        ActivityName.DELETE_FRAGMENTS,
        DeleteFragmentsInput(user_id=user_id),
        result_type=DeleteFragmentsOutput,
        **store_activity("forget: delete fragments"),
    )
    read_model = await workflow.execute_activity(
        ActivityName.DELETE_READ_MODEL,
        DeleteReadModelInput(user_id=user_id),
        result_type=DeleteReadModelOutput,
        **store_activity("forget: delete read model"),
    )
    # Last store step: erase the user's data keys, so no payload of theirs Temporal keeps
    # (histories until their retention, copies of the database) can be decrypted again.
    keys = DestroyUserKeyOutput(destroyed=0)
    if workflow.patched(SHRED_KEYS):
        keys = await workflow.execute_activity(
            DESTROY_USER_KEY,
            DestroyUserKeyInput(user_id=user_id),
            result_type=DestroyUserKeyOutput,
            **store_activity("forget: destroy the user's data keys"),
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
    )
    state_ops.keep_receipt(run.state, receipt)
    run.forget_receipt = receipt
    run.forget_request = None
    if keys.destroyed:
        await _continue_past_shredded_history(run)
    return True


async def _continue_past_shredded_history(run: UserRun) -> None:
    """Continue as new once the receipt is returned: this run's history holds payloads sealed
    with the destroyed key, which no worker can decode again, so a replay of it (after a worker
    restart) would fail; the new run starts from the forgotten state, sealed with a new key."""
    await workflow.wait_condition(workflow.all_handlers_finished)
    absorb(run, workflow.now().timestamp())
    run.state.continued += 1
    workflow.continue_as_new(run.continued_input())
