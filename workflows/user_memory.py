"""UserMemoryWorkflow: the single writer of one user's memory.

Id: `models.ids.user_workflow_id(user_id)`, entered by signal-with-start from the agent side.
Messages: signal `submit` (turns of a thread, de-duplicated by event id and by message identity),
signal `reinforce` (fragments a model call used, applied once per call id); queries `context`,
`profile`, `status`; updates `remember`, `recall`, `forget_fragment`, `forget`, `retry_round`,
`consolidate`, `update_config`.

All state lives in one `UserRun` (workflows/user_state.py); this class declares the handlers
and the loop, and the steps are functions over that object. Handlers only enqueue (or run a
read or an idempotent write); the main loop does the work, one thing at a time: the forget saga,
absorb the inboxes, run a due round as a MemoryRoundWorkflow child, run a due induction, apply
reinforcements, then wait on a durable timer for the next deadline (no polling). It continues
as new when Temporal suggests it or past `max_history_events`, after all handlers finished,
carrying the state and the current config.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.contracts import (
        ConfigUpdate,
        ConfigUpdateResult,
        ConsolidateRequest,
        ConsolidateResult,
        ForgetFragmentRequest,
        ForgetFragmentResult,
        ForgetReceipt,
        ForgetRequest,
        InjectedContext,
        RecallRequest,
        RecallResult,
        ReinforceEvent,
        RememberRequest,
        RememberResult,
        RetryRoundRequest,
        RetryRoundResult,
        ShredRequest,
        SubmitEvent,
        UserMemoryInput,
        UserStatus,
        is_stub,
    )
    from mnemoflow.models.profile import UserProfile
    from mnemoflow.workflows import state_ops, user_forget, user_requests
    from mnemoflow.workflows.user_rounds import describe, maybe_round, number_above_stored
    from mnemoflow.workflows.user_state import UserRun, absorb, status_of
    from mnemoflow.workflows.user_upkeep import maybe_induct, maybe_reinforce


@workflow.defn
class UserMemoryWorkflow:
    """One user's memory: ordering, de-duplication, timers, watermarks, profile, cursors."""

    @workflow.init
    def __init__(self, inp: UserMemoryInput) -> None:
        self._run = UserRun.start(inp)
        self._horizon_rule: bool | None = None  # HORIZON_AT_NOW_PATCH, once asked in this run
        self._archive_rule: bool | None = None  # SEEN_ARCHIVE_PATCH, once asked in this run
        self._late_rule: bool | None = None  # FORGET_COVERS_LATE_TURNS_PATCH, likewise

    @workflow.run
    async def run(self, inp: UserMemoryInput) -> None:
        """Main loop: forget, absorb, round, induction, reinforcement, continue-as-new, sleep."""
        run = self._run
        run.ask_rules()  # first, before any patch: see RULES_PATCH (workflows/user_state.py)
        # Keys a forget of the previous run retired: destroyed before anything else (this
        # run's history is sealed with a newer key; docs/PRIVACY.md).
        await user_forget.shred_retired(run)
        if inp.state is None and run.patched(STORED_FLOOR_PATCH):
            self._absorb()  # what the start brought is accepted (and shown) meanwhile
            await number_above_stored(run)
        while True:
            self._absorb()
            if await user_forget.maybe_forget(run):
                continue
            # Checked before any work: a busy user always has a round due, so a check at idle
            # only let histories grow to ~8,700 events.
            if _past_events_bound(run):
                await self._continue_as_new()
            if await maybe_round(run):
                continue
            if await maybe_induct(run):
                continue
            if await maybe_reinforce(run):
                continue
            if _history_is_long(run):
                await self._continue_as_new()
            await _sleep_until_due(run)

    async def _continue_as_new(self) -> None:
        """After every handler finished, with everything absorbed; carries state and config.
        Returns without continuing while turns waiting for their rounds make the next run's
        input too big (`_waits_for_rounds`): the loop's rounds take them first."""
        run = self._run
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._absorb()
        if _waits_for_rounds(run):
            return
        run.state.continued += 1
        workflow.continue_as_new(run.continued_input())

    def _absorb(self) -> None:
        now = workflow.now().timestamp()
        run = self._run
        if run.epoch_rule is None and any(
            t.epoch is not None for event in run.submits for t in event.turns
        ):
            # Asked only once a message carries an epoch: histories without any replay as
            # they ran (workflows/user_forget.py, FORGET_EPOCH).
            run.epoch_rule = run.patched(user_forget.FORGET_EPOCH)
        absorb(run, now, self._horizon_at_now(now), self._seen_archive, self._late_turns)
        describe(run)

    def _late_turns(self) -> bool:
        """Whether what a forget covers is refused or cut however late it is delivered
        (FORGET_COVERS_LATE_TURNS_PATCH); asked only where the answer changes what is kept."""
        if self._late_rule is None:
            self._late_rule = self._run.patched(FORGET_COVERS_LATE_TURNS_PATCH)
        return self._late_rule

    def _seen_archive(self) -> bool:
        """Whether a message older than its thread's horizon is refused only when it is in the
        archive of identities that left `seen` (SEEN_ARCHIVE_PATCH). Asked only where the
        answer changes what is accepted; once asked, the answer holds for the run."""
        if self._archive_rule is None:
            self._archive_rule = self._run.patched(SEEN_ARCHIVE_PATCH)
        return self._archive_rule

    def _horizon_at_now(self, now: float) -> bool:
        """Whether absorbing keeps horizons at or before `now` (HORIZON_AT_NOW_PATCH). The patch
        is asked only when it can change anything (something stamped ahead of the clock), so a
        history records its marker only then; once asked, the answer holds for the run."""
        run = self._run
        if self._horizon_rule is None and state_ops.stamped_ahead(run.state, run.submits, now):
            self._horizon_rule = run.patched(HORIZON_AT_NOW_PATCH)
        return bool(self._horizon_rule)

    # --- signals and queries ----------------------------------------------------------------

    @workflow.signal
    def submit(self, event: SubmitEvent) -> None:
        """New turns of a thread (enqueued only; the loop de-duplicates and schedules)."""
        self._run.submits.append(event)

    @workflow.signal
    def reinforce(self, event: ReinforceEvent) -> None:
        """Fragments a model call used (applied once per call id)."""
        self._run.reinforcements.append(event)

    @workflow.query
    def context(self) -> InjectedContext:
        """The latest injected context (also published to Redis), without the fragments this
        workflow holds by id only (shape 4: their contents are in the stores and in Redis)."""
        run = self._run
        context = run.context()
        return context.model_copy(
            update={
                "watermarks": state_ops.watermarks(run.state),
                "fragments": [f for f in context.fragments if not is_stub(f)],
            }
        )

    @workflow.query
    def profile(self) -> UserProfile:
        """The stored profile."""
        return self._run.state.profile

    @workflow.query
    def status(self) -> UserStatus:
        """Counters, watermarks, cursor, ledger, config and the recent rounds."""
        return status_of(self._run, workflow.info().get_current_history_length())

    # --- updates (bodies in workflows/user_requests.py and user_forget.py) ------------------

    @workflow.update
    async def remember(self, req: RememberRequest) -> RememberResult:
        """Store an explicit, high-importance fragment and inject it from the next model call."""
        return await user_requests.remember(self._run, req)

    @remember.validator
    def _validate_remember(self, req: RememberRequest) -> None:
        user_requests.validate_remember(self._run, req)

    @workflow.update
    async def recall(self, req: RecallRequest) -> RecallResult:
        """Score the user's fragments for a query (read only)."""
        return await user_requests.recall(self._run, req)

    @recall.validator
    def _validate_recall(self, req: RecallRequest) -> None:
        user_requests.validate_recall(req)

    @workflow.update
    async def forget_fragment(self, req: ForgetFragmentRequest) -> ForgetFragmentResult:
        """Delete one of this user's fragments (ids of other users delete nothing)."""
        return await user_requests.forget_fragment(self._run, req)

    @forget_fragment.validator
    def _validate_forget_fragment(self, req: ForgetFragmentRequest) -> None:
        user_requests.reject_while_forgetting(self._run)

    @workflow.update
    async def forget(self, req: ForgetRequest) -> ForgetReceipt:
        """Forget the user: the main loop runs the saga, this waits for its receipt."""
        return await user_forget.forget(self._run, req)

    @workflow.update
    async def shredded(self, req: ShredRequest) -> ForgetReceipt | None:
        """The last forget's receipt, once the data keys it retired are destroyed."""
        return await user_forget.shredded(self._run)

    @workflow.update
    async def retry_round(self, req: RetryRoundRequest) -> RetryRoundResult:
        """Re-run a failed round now (its messages are still pending)."""
        return user_requests.retry_round(self._run, req)

    @retry_round.validator
    def _validate_retry_round(self, req: RetryRoundRequest) -> None:
        user_requests.validate_retry_round(self._run, req)

    @workflow.update
    async def consolidate(self, req: ConsolidateRequest) -> ConsolidateResult:
        """Slice a thread's pending messages now, without waiting for maturity (session end)."""
        return user_requests.consolidate(self._run, req)

    @consolidate.validator
    def _validate_consolidate(self, req: ConsolidateRequest) -> None:
        user_requests.reject_while_forgetting(self._run)

    @workflow.update
    async def update_config(self, req: ConfigUpdate) -> ConfigUpdateResult:
        """Change the preset or parameters; rounds started from now on use them."""
        return user_requests.update_config(self._run, req)

    @update_config.validator
    def _validate_update_config(self, req: ConfigUpdate) -> None:
        user_requests.validate_update_config(self._run, req)


#: The user workflow continues as new past this many events even when its input allows more
#: (the input's default is 10,000). A worker that does not hold the workflow in its cache
#: replays the whole history before it answers a query or runs the next task; measured in
#: benchmarks/results/throughput.json (`one_user`), this bound keeps that replay well under the
#: hot path's 2 s query timeout on a loaded 2-core machine (docs/PERFORMANCE.md).
HISTORY_EVENTS_BOUND = 1_000
#: Histories that passed the bound under the older rule (checked only when idle, the input's
#: bound only) replay that rule: the new check is taken only where this patch is recorded.
HISTORY_BOUND_PATCH = "history-events-bound-1000"


#: The next run's input (state and config) must stay inside Temporal's 2 MB payload limit: a
#: continue-as-new past it failed its workflow task at every attempt, and the user's memory
#: stopped. Turns waiting for their rounds are what can make it that big (long messages while
#: the memory model is down), and rounds take them at ROUND_MAX_BYTES each.
CONTINUED_MAX_BYTES = 1_500_000
#: Past this many events the run continues as new whatever its input's size (the history's
#: own limits are 51,200 events and 50 MB).
CONTINUED_WAIT_EVENTS = 20_000
#: Runs that wait for their rounds before continuing record this patch; older histories
#: continued at once (the ones whose input passed 2 MB failed there).
CONTINUE_WAITS_PATCH = "continue-as-new-waits-for-rounds"


def _waits_for_rounds(run: UserRun) -> bool:
    """True when pending turns make the next run's input bigger than CONTINUED_MAX_BYTES and the
    history can still grow; the patch is asked only then."""
    if not any(ts.pending for ts in run.state.threads.values()):
        return False
    if workflow.info().get_current_history_length() >= CONTINUED_WAIT_EVENTS:
        return False
    size = len(run.continued_input().model_dump_json().encode("utf-8"))
    return size > CONTINUED_MAX_BYTES and run.patched(CONTINUE_WAITS_PATCH)


def _history_is_long(run: UserRun) -> bool:
    info = workflow.info()
    return (
        info.is_continue_as_new_suggested()
        or info.get_current_history_length() >= run.inp.max_history_events
    )


def _past_events_bound(run: UserRun) -> bool:
    """Past HISTORY_EVENTS_BOUND (or the input's lower bound), in runs that recorded the patch."""
    bound = min(HISTORY_EVENTS_BOUND, run.inp.max_history_events)
    return workflow.info().get_current_history_length() >= bound and run.patched(
        HISTORY_BOUND_PATCH
    )


#: A fresh history (no state carried in) first reads what the stores hold for the user and
#: numbers its rounds and contexts above it; histories from before started at 0.
STORED_FLOOR_PATCH = "fresh-history-numbers-above-stored"

#: A horizon (of a thread whose identities were forgotten, or of a pruned idle thread) never
#: passes the workflow's clock (state_ops.absorb_submit): it changes which lines are accepted,
#: so histories recorded before it replay the old rule.
HORIZON_AT_NOW_PATCH = "horizon-at-now"

#: A message older than its thread's horizon is refused only when the archive of identities
#: that left `seen` holds it (state_ops.absorb_submit): past 4,096 remembered messages a late
#: line a second writer said earlier was refused with no error. Histories recorded before it
#: replay the horizon rule.
SEEN_ARCHIVE_PATCH = "seen-archive"

#: What a forget covers is refused, or cut, however late it is delivered (one patch id with
#: forget_fragment's cut of pending replies: user_requests.FORGET_COVERS_LATE_TURNS).
FORGET_COVERS_LATE_TURNS_PATCH = user_requests.FORGET_COVERS_LATE_TURNS


#: The longest timer the loop sets: the longest timedelta. A deadline past it (a turn stamped
#: in microseconds or nanoseconds, which ChatTurn now refuses and the middleware reads as
#: seconds, but older clients sent) overflowed timedelta and failed every workflow task, so
#: the clamp changes only a path that used to crash: it needs no patch. Defence in depth: no
#: turn a workflow accepts now comes near it.
MAX_TIMER = timedelta.max


def timer_length(due: float, now: float) -> timedelta:
    """How long to sleep until `due` (seconds): a second when it passed (nothing ran although
    a deadline passed, e.g. clock rounding: never spin hot), at most MAX_TIMER (a deadline too
    far for a timedelta, or not a number, waits MAX_TIMER)."""
    seconds = due - now
    if not seconds < MAX_TIMER.total_seconds():  # also NaN
        return MAX_TIMER
    return timedelta(seconds=seconds if seconds > 0 else 1.0)


async def _sleep_until_due(run: UserRun) -> None:
    """Wait for input, or until the next maturity deadline under the current config."""
    now = workflow.now().timestamp()
    due = state_ops.next_due(run.state, run.config, run.held_threads)
    if due is None:
        await workflow.wait_condition(run.has_input)
        return
    try:
        await workflow.wait_condition(
            run.has_input, timeout=timer_length(due, now), timeout_summary="next maturity"
        )
    except TimeoutError:
        pass
