"""Everything UserMemoryWorkflow holds while it runs, in one object: the durable state and inboxes.

`UserRun` is owned by the workflow class; the loop's steps (workflows/user_rounds.py,
user_upkeep.py) and the update bodies (user_requests.py, user_forget.py) are functions that take
it explicitly. Handlers only append to its inboxes; `absorb` is the one place the loop folds
them into the durable state (`UserMemoryState`, carried across continue-as-new). The fields
below `state` live for one run only: whatever they hold is absorbed before continuing as new.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from temporalio import workflow

from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
    ContextFragment,
    ForgetReceipt,
    ForgetRequest,
    FragmentRef,
    InjectedContext,
    ReinforceEvent,
    RoundRecord,
    SubmitEvent,
    UserMemoryInput,
    UserMemoryState,
    UserStatus,
)
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.ids import search_user_value
from mnemoflow.workflows import state_ops

#: Asked first in every run of the user workflow (UserRun.ask_rules). A run that records it
#: takes every patch of PATCHES_APPLIED as applied without asking `workflow.patched`: each would
#: record a marker, and the first ones of a workflow task a TemporalChangeVersion upsert, in
#: every run (0.3 markers and 0.2 upserts a round at 10 rounds a run, docs/PERFORMANCE.md). One
#: marker and one upsert a run instead. A run recorded before it finds no marker when it replays
#: its first task, so it asks each patch as it did. Never extend PATCHES_APPLIED: a run that
#: recorded RULES_PATCH before a new patch existed would replay past the new patch's code as if
#: it had run it. A patch added later is asked in every run, until a rules patch of its own
#: (a new id, and the set it applies) covers it.
RULES_PATCH = "user-workflow-rules-1"
PATCHES_APPLIED = frozenset(
    {
        "continue-as-new-waits-for-rounds",
        "forget-clears-backoff",
        "forget-covers-late-turns",
        "forget-destroys-keys-after-continue-as-new",
        "forget-epochs",
        "forget-failed-round-turns",
        "forget-fragment-facts-by-statement",
        "forget-fragment-publish-counted",
        "forget-fragment-reply-lost",
        "forget-fragment-republishes",
        "forget-fragment-waits-reinforce",
        "forget-lines-checks-context",
        "forget-pending-quotes",
        "forget-shreds-user-keys-1",
        "forget-swept-row",
        "fresh-history-numbers-above-stored",
        "history-events-bound-1000",
        "horizon-at-now",
        "induction-batch-shrinks",
        "induction-facts-by-statement",
        "reinforce-skips-forgotten",
        "remember-publishes-context",
        "remembered-skips-forgotten",
        "round-bytes-bound",
        "round-republished-after-newer",
        "round-takes-stored-epoch",
        "seen-archive",
        "sweep-reads-rows-first",
    }
)


@dataclass
class UserRun:
    """One run of a user's workflow: its input, durable state, inboxes and the forget saga."""

    inp: UserMemoryInput
    state: UserMemoryState
    config: MemoryConfig
    # Inboxes: filled by handlers, emptied by `absorb` in the main loop only.
    submits: list[SubmitEvent] = field(default_factory=list)
    reinforcements: list[ReinforceEvent] = field(default_factory=list)
    remembered: list[FragmentRef] = field(default_factory=list)
    dropped_ids: list[str] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)
    consolidations: list[str] = field(default_factory=list)
    config_change: MemoryConfig | None = None
    # Explicit fragments published since the last round started: its context must keep them.
    remembered_during_round: list[ContextFragment] = field(default_factory=list)
    publishing: bool = False  # the loop is publishing a context it built from the current one
    # The forget saga and what it must wait for or cancel.
    writes_in_flight: int = 0
    # forget_fragment and reinforce: a reinforce reads rows and writes them back whole, so a
    # delete between the two would be undone. The delete waits for a reinforce in flight, and
    # a reinforce leaves out the ids being forgotten or forgotten.
    reinforcing: bool = False
    # A forget taking a failed round's lines out of the rows a retry stored: reinforcements,
    # inductions, plain forgets and other such forgets wait for it, and it for them.
    rewriting: bool = False
    inducting: bool = False
    forgetting: set[str] = field(default_factory=set)
    forget_request: ForgetRequest | None = None
    forget_receipt: ForgetReceipt | None = None
    round_task: asyncio.Task | None = None
    # The round the loop is running (from its start until its outcome is in the state), and
    # the threads whose rounds wait while a forget takes turns out of their pending lists.
    round_record: RoundRecord | None = None
    held_threads: dict[str, int] = field(default_factory=dict)
    # The context version a running round was given: it publishes the next one, so a publish
    # of this workflow meanwhile goes above that (user_rounds.publish_held).
    round_base: int | None = None
    rounds_cancelled: int = 0
    # Whether this run judges messages by their forget epoch (patch FORGET_EPOCH of
    # workflows/user_forget.py; None: not asked yet).
    epoch_rule: bool | None = None
    # The rows each recent round's sweep deleted (round number -> rows as they were): a
    # forget_fragment of one of them that came after the sweep finds its lines here.
    swept_rows: dict[int, list[Fragment]] = field(default_factory=dict)
    # RULES_PATCH as this run answered it (None: not asked yet; the run asks it first).
    rules: bool | None = None

    @classmethod
    def start(cls, inp: UserMemoryInput) -> UserRun:
        """The run of a fresh start or of a continue-as-new (which carries state and config)."""
        return cls(inp=inp, state=inp.state or UserMemoryState(), config=inp.config)

    def has_input(self) -> bool:
        """Something for the loop to do besides waiting for a deadline."""
        return bool(
            self.submits
            or self.reinforcements
            or self.remembered
            or self.dropped_ids
            or self.retries
            or self.consolidations
            or self.config_change is not None
            or self.forget_request is not None
        )

    def pending_events(self) -> int:
        """Signals received but not yet absorbed."""
        return len(self.submits) + len(self.reinforcements)

    def context(self) -> InjectedContext:
        """The latest injected context, or an empty one before the first publish."""
        context = self.state.context or InjectedContext(
            user_id=self.inp.user_id,
            top_k=self.config.top_k,
            profile=self.state.profile,
            version=self.state.context_floor,
        )
        if context.forget_epoch != self.state.forget_epoch:  # agents learn the epoch from it
            context = context.model_copy(update={"forget_epoch": self.state.forget_epoch})
        return context

    def search_user(self) -> str:
        """The MnemoflowUser search-attribute value (a keyed hash when pseudonymous)."""
        return self.inp.search_user or search_user_value(self.inp.user_id)

    def display_user(self) -> str:
        """How the user is named in summaries an operator reads."""
        return self.search_user() if self.inp.pseudonymous else self.inp.user_id[:80]

    def ask_rules(self) -> bool:
        """Whether this run applies PATCHES_APPLIED without asking (RULES_PATCH, asked once)."""
        if self.rules is None:
            self.rules = workflow.patched(RULES_PATCH)
        return self.rules

    def patched(self, patch_id: str) -> bool:
        """`workflow.patched(patch_id)`, or True without asking in a run under RULES_PATCH
        when it is one of PATCHES_APPLIED."""
        if patch_id in PATCHES_APPLIED and self.ask_rules():
            return True
        return workflow.patched(patch_id)

    def continued_input(self) -> UserMemoryInput:
        """The input of the next run: the durable state and the current config."""
        return self.inp.model_copy(update={"state": self.state, "config": self.config})


def absorb(
    run: UserRun,
    now: float,
    horizon_at_now: bool = False,
    archive_rule: Callable[[], bool] | None = None,
    late_rule: Callable[[], bool] | None = None,
) -> None:
    """Fold every inbox into the durable state, in a fixed order (submits before the requests
    that act on their turns: a consolidate right after a hand-over must see its turns).
    `horizon_at_now`, `archive_rule`, `late_rule`: see state_ops.absorb_submit (the workflow's
    patches decide)."""
    for event in run.submits:
        state_ops.absorb_submit(
            run.state,
            event,
            run.config,
            now,
            horizon_at_now,
            epoch_rule=bool(run.epoch_rule),
            archive_rule=archive_rule,
            late_rule=late_rule,
        )
    for used in run.reinforcements:
        state_ops.absorb_reinforce(run.state, used)
    run.submits.clear()
    run.reinforcements.clear()
    absorb_requests(run)


def absorb_requests(run: UserRun) -> None:
    """Fold what the update handlers enqueued (fragment seq numbers are only given out here)."""
    s = run.state
    for ref in run.remembered:
        state_ops.absorb_remembered(s, ref)
    run.remembered.clear()
    for thread_id in run.retries:
        state_ops.schedule_retry(s, thread_id)
    run.retries.clear()
    for thread_id in run.consolidations:
        state_ops.schedule_consolidation(s, thread_id)
    run.consolidations.clear()
    if run.dropped_ids:
        state_ops.drop_uninducted(s, set(run.dropped_ids))
        run.dropped_ids.clear()
    if run.config_change is not None:
        run.config, run.config_change = run.config_change, None


def status_of(run: UserRun, history_length: int) -> UserStatus:
    """The status query's answer."""
    s = run.state
    return UserStatus(
        user_id=run.inp.user_id,
        rounds_started=s.rounds_started,
        rounds_completed=s.rounds_completed,
        rounds_failed=s.rounds_failed,
        pending_turns=sum(len(t.pending) for t in s.threads.values()),
        pending_events=run.pending_events() + len(s.pending_reinforce),
        watermarks=state_ops.watermarks(s),
        induction_cursor=s.induction_cursor,
        uninducted=len(s.uninducted),
        inductions=s.inductions,
        tuned_themes=list(s.tuned),
        tuned=dict(s.tuned),
        ledger=s.ledger,
        rounds=list(s.rounds),
        last_error=s.last_error,
        continued=s.continued,
        history_length=history_length,
        config=run.config_change or run.config,
        forget_pending=run.forget_request is not None,
        forget_epoch=s.forget_epoch,
        refused_stale=s.refused_stale,
        refused_after_forget=run.state.refused_after_forget,
    )
