"""Forgetting a user: a saga the main loop of UserMemoryWorkflow runs before anything else.

The forget update only records the request (and cancels the running round); the loop then waits
for in-flight writes, clears the state, deletes the fragments and the read model, and keeps a
receipt, which the update returns. It leaves nothing a later round could resurrect.
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
    from mnemoflow.workflows import state_ops
    from mnemoflow.workflows.options import store_activity
    from mnemoflow.workflows.user_state import UserRun, absorb_requests


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
    )
    state_ops.keep_receipt(run.state, receipt)
    run.forget_receipt = receipt
    run.forget_request = None
    return True
