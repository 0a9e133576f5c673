"""The user-facing updates of UserMemoryWorkflow: remember, recall, forget a fragment, forget all.

A mixin of the user workflow, kept apart so each file stays readable. Recall only reads, so its
handler runs the select activity itself (a tool call must not wait behind a round stuck in LLM
retries). Remember and forget-fragment write through idempotent activities and then enqueue
their state change for the main loop. Forgetting the user is a saga the main loop runs first:
cancel the running round, drop queued events, wait for in-flight writes, delete the fragments,
the read model and the profile, and keep a receipt.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.config import FRAGMENT_TYPES
    from mnemoflow.models.contracts import (
        ActivityName,
        DeleteFragmentsInput,
        DeleteFragmentsOutput,
        DeleteReadModelInput,
        DeleteReadModelOutput,
        ForgetFragmentRequest,
        ForgetFragmentResult,
        ForgetReceipt,
        ForgetRequest,
        FragmentRef,
        IndexInput,
        IndexOutput,
        RecallRequest,
        RecallResult,
        RememberRequest,
        RememberResult,
        RetryRoundRequest,
        RetryRoundResult,
        SelectInput,
        SelectOutput,
        UserMemoryInput,
        UserMemoryState,
    )
    from mnemoflow.models.fragments import Fragment
    from mnemoflow.models.ids import explicit_fragment_id
    from mnemoflow.models.params import TunedParams
    from mnemoflow.models.profile import UserProfile
    from mnemoflow.workflows import state_ops
    from mnemoflow.workflows.memory_round import (
        STORE_RETRY,
        STORE_SCHEDULE_TO_CLOSE,
        STORE_START_TO_CLOSE,
    )

#: An explicit memory starts as if reinforced a few times: the user asked for it.
EXPLICIT_STRENGTH = 4


def _store_options(summary: str) -> dict:
    return {
        "start_to_close_timeout": STORE_START_TO_CLOSE,
        "schedule_to_close_timeout": STORE_SCHEDULE_TO_CLOSE,
        "retry_policy": STORE_RETRY,
        "summary": summary,
    }


class UserRequests:
    """Update handlers and the forget saga (mixed into UserMemoryWorkflow)."""

    _inp: UserMemoryInput
    _s: UserMemoryState
    _explicit_inbox: list[FragmentRef]
    _dropped_ids: list[str]
    _writes_in_flight: int
    _forget_request: ForgetRequest | None
    _forget_receipt: ForgetReceipt | None
    _round_handle: asyncio.Task | None
    _rounds_cancelled: int
    _retry_inbox: list[str]

    def _init_requests(self) -> None:
        self._explicit_inbox = []
        self._dropped_ids = []
        self._writes_in_flight = 0
        self._forget_request = None
        self._forget_receipt = None
        self._round_handle = None
        self._rounds_cancelled = 0
        self._retry_inbox = []

    @workflow.update
    async def remember(self, req: RememberRequest) -> RememberResult:
        """Store an explicit, high-importance fragment (idempotent by event id)."""
        now = workflow.now().timestamp()
        fragment = Fragment(
            id=explicit_fragment_id(self._inp.user_id, req.event_id),
            user_id=self._inp.user_id,
            theme=req.theme,
            types=[t for t in req.types if t in FRAGMENT_TYPES] or ["fact"],
            content=req.content,
            created_at=now,
            reinforced_at=now,
            strengthen_count=EXPLICIT_STRENGTH,
            explicit=True,
        )
        self._writes_in_flight += 1
        try:
            await workflow.execute_activity(
                ActivityName.INDEX,
                IndexInput(fragments=[fragment]),
                result_type=IndexOutput,
                **_store_options("remember explicitly"),
            )
        finally:
            self._writes_in_flight -= 1
        self._explicit_inbox.append(FragmentRef(id=fragment.id, created_at=now, seq=0))
        return RememberResult(fragment_id=fragment.id)

    @remember.validator
    def _validate_remember(self, req: RememberRequest) -> None:
        self._reject_while_forgetting()
        if not req.content.strip():
            raise ValueError("nothing to remember: the text is empty")

    @workflow.update
    async def recall(self, req: RecallRequest) -> RecallResult:
        """Score the user's fragments for a query (read only)."""
        out = await workflow.execute_activity(
            ActivityName.SELECT,
            SelectInput(
                user_id=self._inp.user_id,
                query=req.query,
                params=TunedParams(),
                config=self._inp.config.model_copy(
                    update={"top_k": req.top_k, "always_inject_types": ()}
                ),
                now=workflow.now().timestamp(),
                limit=req.top_k,
            ),
            result_type=SelectOutput,
            **_store_options("recall"),
        )
        return RecallResult(fragments=out.fragments[: req.top_k], log=out.log)

    @recall.validator
    def _validate_recall(self, req: RecallRequest) -> None:
        if not req.query.strip():
            raise ValueError("recall needs a non-empty query")

    @workflow.update
    async def forget_fragment(self, req: ForgetFragmentRequest) -> ForgetFragmentResult:
        """Delete one of this user's fragments (ids of other users delete nothing)."""
        self._writes_in_flight += 1
        try:
            out = await workflow.execute_activity(
                ActivityName.DELETE_FRAGMENTS,
                DeleteFragmentsInput(user_id=self._inp.user_id, ids=[req.fragment_id]),
                result_type=DeleteFragmentsOutput,
                **_store_options("forget one fragment"),
            )
        finally:
            self._writes_in_flight -= 1
        self._dropped_ids.append(req.fragment_id)
        return ForgetFragmentResult(deleted=out.deleted)

    @forget_fragment.validator
    def _validate_forget_fragment(self, req: ForgetFragmentRequest) -> None:
        self._reject_while_forgetting()

    @workflow.update
    async def forget(self, req: ForgetRequest) -> ForgetReceipt:
        """Forget the user: the main loop runs the saga, this waits for its receipt."""
        if self._forget_request is None:
            self._forget_receipt = None
            self._forget_request = req
            if self._round_handle is not None and not self._round_handle.done():
                self._round_handle.cancel()
        await workflow.wait_condition(lambda: self._forget_receipt is not None)
        assert self._forget_receipt is not None
        return self._forget_receipt

    @workflow.update
    async def retry_round(self, req: RetryRoundRequest) -> RetryRoundResult:
        """Re-run a failed round now; its messages are still pending, un-indexed.

        Works after any number of continue-as-new, unlike resetting the round's child workflow:
        the turns live in this workflow's state, and a new round is started for them.
        """
        record = next(r for r in reversed(self._s.rounds) if r.event_id == req.event_id)
        ts = self._s.threads.get(record.thread_id)
        pending = len(ts.pending) if ts else 0
        if not pending:
            return RetryRoundResult(
                scheduled=False, thread_id=record.thread_id, reason="nothing left to retry"
            )
        self._retry_inbox.append(record.thread_id)
        return RetryRoundResult(scheduled=True, thread_id=record.thread_id, pending_turns=pending)

    @retry_round.validator
    def _validate_retry_round(self, req: RetryRoundRequest) -> None:
        self._reject_while_forgetting()
        failed = [r for r in self._s.rounds if r.event_id == req.event_id]
        if not failed:
            raise ValueError(f"no recent round with event id {req.event_id!r}")
        if failed[-1].status != "failed":
            raise ValueError(f"round {failed[-1].round_no} did not fail ({failed[-1].status})")

    def _reject_while_forgetting(self) -> None:
        if self._forget_request is not None:
            raise ApplicationError("the user is being forgotten", type="InvalidInput")

    def _absorb_requests(self) -> None:
        """Apply what the write handlers enqueued (seq numbers are only given out here)."""
        for ref in self._explicit_inbox:
            self._s.fragment_seq += 1
            self._s.uninducted.append(ref.model_copy(update={"seq": self._s.fragment_seq}))
        self._explicit_inbox.clear()
        for thread_id in self._retry_inbox:
            state_ops.schedule_retry(self._s, thread_id)
        self._retry_inbox.clear()
        if self._dropped_ids:
            dropped = set(self._dropped_ids)
            self._s.uninducted = [r for r in self._s.uninducted if r.id not in dropped]
            self._dropped_ids.clear()

    async def _maybe_forget(self, pending_events: int) -> bool:
        """The forget saga; leaves nothing a later round could resurrect."""
        req = self._forget_request
        if req is None:
            return False
        await workflow.wait_condition(lambda: self._writes_in_flight == 0)
        self._absorb_requests()
        s = self._s
        dropped = pending_events + len(s.pending_reinforce)
        for ts in s.threads.values():
            dropped += len(ts.pending)
            # Positions already seen stay seen: a re-send of old turns brings nothing back.
            ts.indexed = ts.accepted = max(ts.accepted, ts.indexed)
            ts.indexed_ahead = []
            ts.pending = []
            ts.urgent = False
        fragments = await workflow.execute_activity(
            ActivityName.DELETE_FRAGMENTS,
            DeleteFragmentsInput(user_id=self._inp.user_id),
            result_type=DeleteFragmentsOutput,
            **_store_options("forget: delete fragments"),
        )
        read_model = await workflow.execute_activity(
            ActivityName.DELETE_READ_MODEL,
            DeleteReadModelInput(user_id=self._inp.user_id),
            result_type=DeleteReadModelOutput,
            **_store_options("forget: delete read model"),
        )
        cancelled, self._rounds_cancelled = self._rounds_cancelled, 0
        s.pending_reinforce = []
        s.uninducted = []
        s.tuned = {}
        s.profile = UserProfile()
        s.context = None
        s.last_error = None
        self._forget_receipt = ForgetReceipt(
            user_id=self._inp.user_id,
            at=workflow.now().timestamp(),
            fragments_deleted=fragments.deleted,
            read_model_deleted=read_model.deleted,
            profile_cleared=True,
            events_dropped=dropped,
            rounds_cancelled=cancelled,
            reason=req.reason,
        )
        s.forget_receipts.append(self._forget_receipt)
        del s.forget_receipts[:-20]
        self._forget_request = None
        return True
