"""UserMemoryWorkflow: the single writer of one user's memory.

Id: `models.ids.user_workflow_id(user_id)`, entered by signal-with-start from the agent side.
Messages: signal `submit` (turns of a thread, de-duplicated by event id and by thread position),
signal `reinforce` (fragments a model call used, applied once per call id); queries `context`,
`profile`, `status`.

Handlers only enqueue; the main loop does the work, one thing at a time: absorb the inbox, run a
due round as a MemoryRoundWorkflow child, run a due induction, apply reinforcements, then wait on
a durable timer for the next maturity deadline (no polling). It continues-as-new when Temporal
suggests it or past `max_history_events`, after all handlers finished, carrying all state.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import (
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ChildWorkflowHandle

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.contracts import (
        InjectedContext,
        ReinforceEvent,
        RoundInput,
        RoundRecord,
        RoundResult,
        SubmitEvent,
        UserMemoryInput,
        UserMemoryState,
        UserStatus,
    )
    from mnemoflow.models.ids import round_workflow_id, search_user_value
    from mnemoflow.models.profile import UserProfile
    from mnemoflow.workflows import state_ops
    from mnemoflow.workflows.memory_round import (
        MemoryRoundWorkflow,
    )
    from mnemoflow.workflows.options import failure_text, round_search_attributes
    from mnemoflow.workflows.user_requests import UserRequests
    from mnemoflow.workflows.user_upkeep import UserUpkeep

MAX_ROUND_ID_PROBES = 24


@workflow.defn
class UserMemoryWorkflow(UserUpkeep, UserRequests):
    """One user's memory: ordering, de-duplication, timers, watermarks, profile, cursors."""

    @workflow.init
    def __init__(self, inp: UserMemoryInput) -> None:
        self._inp = inp
        self._cfg = inp.config
        self._s: UserMemoryState = inp.state or UserMemoryState()
        self._inbox: list[SubmitEvent] = []
        self._reinforce_inbox: list[ReinforceEvent] = []
        self._init_requests()

    @workflow.run
    async def run(self, inp: UserMemoryInput) -> None:
        """Main loop: absorb, round, induction, reinforcement, continue-as-new, sleep."""
        while True:
            self._absorb()
            if await self._maybe_forget(0):
                continue
            if await self._maybe_round():
                continue
            if await self._maybe_induct():
                continue
            if await self._maybe_reinforce():
                continue
            if self._history_is_long():
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._absorb()
                self._s.continued += 1
                workflow.continue_as_new(self._inp.model_copy(update={"state": self._s}))
            await self._sleep_until_due()

    # --- the loop's steps -------------------------------------------------------------------

    def _absorb(self) -> None:
        now = workflow.now().timestamp()
        for event in self._inbox:
            state_ops.absorb_submit(self._s, event, self._cfg, now)
        for used in self._reinforce_inbox:
            state_ops.absorb_reinforce(self._s, used)
        self._inbox.clear()
        self._reinforce_inbox.clear()
        self._absorb_requests()
        self._describe()

    async def _maybe_round(self) -> bool:
        now = workflow.now().timestamp()
        thread_id = state_ops.due_thread(self._s, self._cfg, now)
        if thread_id is None:
            return False
        ts = self._s.threads[thread_id]
        batch = state_ops.round_batch(ts, self._cfg.max_turns_per_round)
        start, end = batch[0].position, batch[-1].position + 1
        trigger = ts.trigger
        after = state_ops.watermarks(self._s)
        indexed = state_ops.indexed_after(ts, batch)
        after[thread_id] = after[thread_id].model_copy(update={"indexed": indexed})
        record = RoundRecord(
            round_no=0,
            workflow_id="",
            event_id=f"{thread_id}:{start}-{end}",
            thread_id=thread_id,
            start=start,
            end=end,
            trigger=trigger,
            started_at=now,
        )
        try:
            self._round_handle = await self._start_round(record, batch, after)
            result = await self._round_handle
        except (ChildWorkflowError, ApplicationError) as err:
            state_ops.round_failed(self._s, record, failure_text(err), now, self._cfg)
            return True
        except asyncio.CancelledError:
            if self._forget_request is None:
                raise  # the user workflow itself is being cancelled
            state_ops.round_failed(self._s, record, "cancelled by forget", now, self._cfg)
            self._rounds_cancelled += 1
            return True
        finally:
            self._round_handle = None
        state_ops.round_completed(
            self._s, record, result, batch, workflow.now().timestamp(), self._inp.prices
        )
        return True

    async def _start_round(
        self, record: RoundRecord, batch: list, after: dict
    ) -> ChildWorkflowHandle[MemoryRoundWorkflow, RoundResult]:
        """Start the round child; a number already used (fresh history) is skipped, not reused."""
        parent_id = workflow.info().workflow_id
        step = 1
        for _ in range(MAX_ROUND_ID_PROBES):
            self._s.rounds_started += 1
            round_no = self._s.rounds_started
            record.round_no = round_no
            record.workflow_id = round_workflow_id(parent_id, round_no)
            try:
                handle = await workflow.start_child_workflow(
                    MemoryRoundWorkflow.run,
                    self._round_input(record, batch, after),
                    id=record.workflow_id,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    search_attributes=self._round_attributes(record),
                    static_summary=(
                        f"user {self._display_user()}, round {round_no}, "
                        f"{len(batch)} messages, trigger {record.trigger}"
                    ),
                )
            except WorkflowAlreadyStartedError:
                self._s.rounds_started += step - 1
                step *= 2
                continue
            state_ops.round_started(self._s, record)
            self._describe()
            return handle
        raise ApplicationError("no free round id", type="InvalidInput", non_retryable=True)

    def _round_input(self, record: RoundRecord, batch: list, after: dict) -> RoundInput:
        return RoundInput(
            user_id=self._inp.user_id,
            round_no=record.round_no,
            event_id=record.event_id,
            thread_id=record.thread_id,
            turns=batch,
            trigger=record.trigger,
            first_seq=self._s.fragment_seq + 1,
            config=self._cfg,
            tuned=self._s.tuned,
            profile=self._s.profile,
            watermarks_after=after,
            context_version=self._context().version,
            llm_task_queue=self._inp.llm_task_queue,
            search_attributes=self._inp.search_attributes,
        )

    def _history_is_long(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._inp.max_history_events
        )

    async def _sleep_until_due(self) -> None:
        now = workflow.now().timestamp()
        due = state_ops.next_due(self._s, self._cfg)
        has_input = lambda: bool(  # noqa: E731
            self._inbox
            or self._reinforce_inbox
            or self._explicit_inbox
            or self._dropped_ids
            or self._retry_inbox
            or self._forget_request
        )
        if due is None:
            await workflow.wait_condition(has_input)
            return
        if due <= now:
            # Nothing ran although a deadline passed (e.g. clock rounding): never spin hot.
            due = now + 1.0
        try:
            await workflow.wait_condition(
                has_input, timeout=timedelta(seconds=due - now), timeout_summary="next maturity"
            )
        except TimeoutError:
            pass

    # --- helpers ----------------------------------------------------------------------------

    def _context(self) -> InjectedContext:
        return self._s.context or InjectedContext(
            user_id=self._inp.user_id, top_k=self._cfg.top_k, profile=self._s.profile
        )

    def _display_user(self) -> str:
        if self._inp.pseudonymous:
            return self._search_user()
        return self._inp.user_id[:80]

    def _search_user(self) -> str:
        return self._inp.search_user or search_user_value(self._inp.user_id)

    def _round_attributes(self, record: RoundRecord) -> TypedSearchAttributes | None:
        if not self._inp.search_attributes:
            return None
        return round_search_attributes(
            user=self._search_user(),
            round_no=record.round_no,
            trigger=record.trigger,
            outcome="running",
        )

    def _describe(self) -> None:
        s = self._s
        pending = sum(len(t.pending) for t in s.threads.values())
        marks = ", ".join(
            f"{k[:40]} {v.indexed}/{v.accepted}" for k, v in state_ops.watermarks(s).items()
        )
        workflow.set_current_details(
            f"rounds {s.rounds_completed} done, {s.rounds_failed} failed; "
            f"pending turns {pending}, pending events {len(self._inbox)}; "
            f"indexed/accepted: {marks or '-'}; induction cursor {s.induction_cursor}; "
            f"last error: {s.last_error or '-'}"
        )

    # --- messages ---------------------------------------------------------------------------

    @workflow.signal
    def submit(self, event: SubmitEvent) -> None:
        """New turns of a thread (enqueued only; the loop de-duplicates and schedules)."""
        self._inbox.append(event)

    @workflow.signal
    def reinforce(self, event: ReinforceEvent) -> None:
        """Fragments a model call used (applied once per call id)."""
        self._reinforce_inbox.append(event)

    @workflow.query
    def context(self) -> InjectedContext:
        """The latest injected context (also published to Redis)."""
        return self._context().model_copy(update={"watermarks": state_ops.watermarks(self._s)})

    @workflow.query
    def profile(self) -> UserProfile:
        """The stored profile."""
        return self._s.profile

    @workflow.query
    def status(self) -> UserStatus:
        """Counters, watermarks, cursor, ledger and the recent rounds."""
        return state_ops.status(
            self._s,
            self._inp.user_id,
            pending_events=len(self._inbox) + len(self._reinforce_inbox),
            history_length=workflow.info().get_current_history_length(),
        )
