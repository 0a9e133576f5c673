"""Upkeep steps of UserMemoryWorkflow's loop: induction into the profile, reinforcement.

A mixin of the user workflow, kept apart so each file stays readable. Both run in the main loop
only (never in a handler), between rounds: induction when the oldest un-inducted fragment
reached the long-term gate, reinforcement once per model call that used injected fragments.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.config import MemoryConfig
    from mnemoflow.models.contracts import (
        ActivityName,
        InductInput,
        InductOutput,
        InjectedContext,
        ReinforceInput,
        ReinforceOutput,
        UserMemoryInput,
        UserMemoryState,
    )
    from mnemoflow.workflows import state_ops
    from mnemoflow.workflows.memory_round import (
        LLM_RETRY,
        LLM_SCHEDULE_TO_CLOSE,
        LLM_START_TO_CLOSE,
        STORE_RETRY,
        STORE_SCHEDULE_TO_CLOSE,
        STORE_START_TO_CLOSE,
        publish_context,
    )
    from mnemoflow.workflows.options import failure_text

MAX_INDUCTION_BATCH = 32


class UserUpkeep:
    """Induction and reinforcement (mixed into UserMemoryWorkflow)."""

    _inp: UserMemoryInput
    _cfg: MemoryConfig
    _s: UserMemoryState

    def _context(self) -> InjectedContext:
        raise NotImplementedError  # provided by UserMemoryWorkflow

    async def _maybe_induct(self) -> bool:
        now = workflow.now().timestamp()
        batch = state_ops.mature_for_induction(self._s, self._cfg, now)[:MAX_INDUCTION_BATCH]
        if not batch:
            return False
        try:
            out = await workflow.execute_activity(
                ActivityName.INDUCT,
                InductInput(
                    user_id=self._inp.user_id,
                    profile=self._s.profile,
                    fragment_ids=[r.id for r in batch],
                    list_limit=self._cfg.profile_list_limit,
                ),
                result_type=InductOutput,
                task_queue=self._inp.llm_task_queue,
                start_to_close_timeout=LLM_START_TO_CLOSE,
                schedule_to_close_timeout=LLM_SCHEDULE_TO_CLOSE,
                retry_policy=LLM_RETRY,
                summary=f"induct {len(batch)} fragments",
            )
            # Store the merged profile first: the cursor never moves past an unstored profile.
            context = self._context().model_copy(
                update={
                    "profile": out.profile,
                    "version": self._context().version + 1,
                    "generated_at": workflow.now().timestamp(),
                    "watermarks": state_ops.watermarks(self._s),
                }
            )
            await publish_context(context)
        except ActivityError as err:
            self._s.last_error = f"induction failed: {failure_text(err)}"
            self._s.induction_not_before = now + self._cfg.failed_round_backoff_s
            return True
        self._s.context = context
        state_ops.induction_stored(self._s, batch, out, self._inp.prices)
        return True

    async def _maybe_reinforce(self) -> bool:
        if not self._s.pending_reinforce:
            return False
        event = self._s.pending_reinforce.pop(0)
        try:
            await workflow.execute_activity(
                ActivityName.REINFORCE,
                ReinforceInput(
                    user_id=self._inp.user_id,
                    call_id=event.call_id,
                    fragment_ids=event.fragment_ids,
                    now=workflow.now().timestamp(),
                ),
                result_type=ReinforceOutput,
                start_to_close_timeout=STORE_START_TO_CLOSE,
                schedule_to_close_timeout=STORE_SCHEDULE_TO_CLOSE,
                retry_policy=STORE_RETRY,
                summary=f"reinforce {len(event.fragment_ids)} fragments",
            )
        except ActivityError as err:
            self._s.last_error = f"reinforce failed: {failure_text(err)}"
        return True
