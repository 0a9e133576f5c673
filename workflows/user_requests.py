"""The bodies of UserMemoryWorkflow's updates (the class only declares the handlers).

Recall only reads, so it runs the select activity itself (a tool call must not wait behind a
round stuck in LLM retries). Remember and forget-fragment write through idempotent activities,
then enqueue their state change for the main loop. Retry, consolidate and a config change only
enqueue: the loop applies them after absorbing the hand-overs that came before them.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.config import FRAGMENT_TYPES
    from mnemoflow.models.contracts import (
        ActivityName,
        ConfigUpdate,
        ConfigUpdateResult,
        ConsolidateRequest,
        ConsolidateResult,
        ContextFragment,
        DeleteFragmentsInput,
        DeleteFragmentsOutput,
        ForgetFragmentRequest,
        ForgetFragmentResult,
        ForgetLines,
        FragmentRef,
        IndexInput,
        IndexOutput,
        RecallRequest,
        RecallResult,
        RememberRequest,
        RememberResult,
        RetryRoundRequest,
        RetryRoundResult,
        RoundRecord,
        SelectInput,
        SelectOutput,
    )
    from mnemoflow.models.fragments import Fragment, quoted_texts
    from mnemoflow.models.ids import explicit_fragment_id
    from mnemoflow.models.params import TunedParams
    from mnemoflow.models.round_store import round_of
    from mnemoflow.models.turns import identity_digest, turn_identity
    from mnemoflow.workflows import state_ops
    from mnemoflow.workflows.options import STORE_HEARTBEAT, store_activity
    from mnemoflow.workflows.remembered import (
        REMEMBER_PUBLISHES,
        with_remembered,
    )
    from mnemoflow.workflows.user_rounds import publish_held
    from mnemoflow.workflows.user_state import UserRun

#: Patch id of forget_fragment's republish (histories before it only deleted the row).
FORGET_FRAGMENT_REPUBLISHES = "forget-fragment-republishes"
#: forget_fragment of a row of a round that failed after its write drops the pending turns the
#: row covered (and the rows a round already running stores for them again).
FORGET_FAILED_ROUND_TURNS = "forget-failed-round-turns"
#: forget_fragment waits for a reinforce in flight before it deletes.
FORGET_FRAGMENT_WAITS_REINFORCE = "forget-fragment-waits-reinforce"
#: A forgotten row is read first and cut out of the pending turns that quote it (patch id).
FORGET_PENDING_QUOTES = "forget-pending-quotes"
#: What a forget covers is refused, or cut, however late it is delivered
#: (state_ops.covered_by_forget): a copy re-sent without a time stamp after the user was
#: forgotten, a reply of a turn whose question the forget refused, and the words a reply took
#: from a fragment forgotten since, on arrival and while it waits for its round
#: (state_ops.cut_replies_quoting). Histories recorded before it kept such turns.
FORGET_COVERS_LATE_TURNS = "forget-covers-late-turns"

#: forget_fragment keeps a fact only when another kept fragment states it (privacy first: one
#: credited to a whole batch goes, and the batch's other fragments are inducted again).
FORGET_FRAGMENT_BY_STATEMENT = "forget-fragment-facts-by-statement"
#: forget_fragment cleans up after a delete whose reply was lost (a retried delete finds 0 rows).
FORGET_FRAGMENT_REPLY_LOST = "forget-fragment-reply-lost"
#: forget_fragment's republish counts as a write in flight, which the forget saga waits for.
FORGET_FRAGMENT_PUBLISH_COUNTED = "forget-fragment-publish-counted"
#: forget_fragment of a failed round's row that a retry already swept takes its lines out of
#: the retry's rows (the sweep hands the rows it deleted back in the round's result).
FORGET_SWEPT_ROW = "forget-swept-row"
#: A rewrite (`ForgetLines`) checks the rows the context shows with the forgotten lines: after
#: a lost reply, the retried call finds nothing left to do, yet those rows leave the context
#: or show their new contents (docs/ARCHITECTURE.md, "The round").
FORGET_LINES_CHECKS_CONTEXT = "forget-lines-checks-context"

#: An explicit memory starts as if reinforced a few times: the user asked for it.
EXPLICIT_STRENGTH = 4


async def remember(run: UserRun, req: RememberRequest) -> RememberResult:
    """Store an explicit fragment (idempotent by event id) and publish it at once."""
    now = workflow.now().timestamp()
    fragment = Fragment(
        id=explicit_fragment_id(run.inp.user_id, req.event_id),
        user_id=run.inp.user_id,
        theme=req.theme,
        types=[t for t in req.types if t in FRAGMENT_TYPES] or ["fact"],
        content=req.content,
        created_at=now,
        reinforced_at=now,
        strengthen_count=EXPLICIT_STRENGTH,
        explicit=True,
    )
    # The forget saga waits for writes in flight: the publish counts too, or it could bring
    # back a read model the saga already deleted.
    run.writes_in_flight += 1
    try:
        await workflow.execute_activity(
            ActivityName.INDEX,
            IndexInput(fragments=[fragment], epoch=run.state.forget_epoch),
            result_type=IndexOutput,
            **store_activity("remember explicitly"),
        )
        run.remembered.append(FragmentRef(id=fragment.id, created_at=now, seq=0))
        if run.patched(REMEMBER_PUBLISHES):
            await _publish_remembered(run, fragment)
    finally:
        run.writes_in_flight -= 1
    return RememberResult(fragment_id=fragment.id)


async def _publish_remembered(run: UserRun, fragment: Fragment) -> None:
    """Put the fragment in the context now; state first, so the query and any later publish
    (induction, the round running now) carry it even if this publish gives up."""
    await workflow.wait_condition(lambda: not run.publishing)
    if run.forget_request is not None:
        return  # forgotten while it was being stored: the saga deletes it, never publish it
    published = ContextFragment.of(fragment)  # no thread: never in a model's window
    context = with_remembered(
        run.context(),
        published,
        workflow.now().timestamp(),
        limit=run.config.published_candidates,
    )
    run.state.context = context.model_copy(update={"watermarks": state_ops.watermarks(run.state)})
    run.remembered_during_round.append(published)  # the loop clears it when a round starts
    await publish_held(run)


def validate_remember(run: UserRun, req: RememberRequest) -> None:
    reject_while_forgetting(run)
    if not req.content.strip():
        raise ValueError("nothing to remember: the text is empty")


async def recall(run: UserRun, req: RecallRequest) -> RecallResult:
    """Score the user's fragments for a query (read only)."""
    out = await workflow.execute_activity(
        ActivityName.SELECT,
        SelectInput(
            user_id=run.inp.user_id,
            query=req.query,
            params=TunedParams(),
            config=run.config.model_copy(update={"top_k": req.top_k, "always_inject_types": ()}),
            now=workflow.now().timestamp(),
            limit=req.top_k,
        ),
        result_type=SelectOutput,
        **store_activity("recall"),
    )
    return RecallResult(fragments=out.fragments[: req.top_k], log=out.log)


def validate_recall(req: RecallRequest) -> None:
    if not req.query.strip():
        raise ValueError("recall needs a non-empty query")


async def forget_fragment(run: UserRun, req: ForgetFragmentRequest) -> ForgetFragmentResult:
    """Delete one of this user's fragments (ids of other users delete nothing), remove the
    profile facts it stated that no other kept fragment states, and republish the read model at
    once. A reinforce in flight is waited for first: it could write the row back after the
    delete."""
    run.forgetting.add(req.fragment_id)
    # A row of a round that failed after its write: its turns are still pending, and slicing
    # them again would store what is forgotten here once more. The thread's rounds wait while
    # the forget takes those turns out (docs/ARCHITECTURE.md, "The round").
    made_in = round_of(run.inp.user_id, req.fragment_id)
    thread_id = state_ops.failed_round_thread(run.state, made_in)
    if thread_id is not None and not run.patched(FORGET_FAILED_ROUND_TURNS):
        thread_id = None
    # Kept when a round read it before its sweep (user_rounds.SWEEP_READS_FIRST): its thread
    # even when its round left the thread's list since (more failures than it keeps).
    kept = state_ops.swept_row(run.state, req.fragment_id)
    if thread_id is None and kept is not None and kept.thread_id in run.state.threads:
        thread_id = kept.thread_id
    # A round of the thread already running may take the row's turns (none starts from here).
    running = run.round_record
    if thread_id is not None:
        run.held_threads[thread_id] = run.held_threads.get(thread_id, 0) + 1
    try:
        if run.patched(FORGET_FRAGMENT_WAITS_REINFORCE):
            await workflow.wait_condition(lambda: not run.reinforcing and not run.rewriting)
        user = run.inp.user_id
        rows: list[Fragment] = []
        quotes = req.quotes and run.patched(FORGET_PENDING_QUOTES)
        if thread_id is not None or quotes:  # read first: a retried delete cannot read it back
            read = DeleteFragmentsInput(user_id=user, ids=[], read=[req.fragment_id])
            rows = (await _delete(run, read, "read the row to forget")).rows
        out = await _delete(
            run, DeleteFragmentsInput(user_id=user, ids=[req.fragment_id]), "forget one fragment"
        )
        if rows and not out.deleted:  # there when read: an earlier attempt's reply was lost
            out = out.model_copy(update={"deleted": len(rows)})
        if out.deleted:
            _cut_replies_quoting(run, req.fragment_id)
        if thread_id is not None and running is not None and running.thread_id != thread_id:
            running = None
        swept = None
        if not rows and made_in is not None:
            swept = await _swept_row(run, req.fragment_id, thread_id, running)
        if swept is not None:
            out = out.model_copy(update={"deleted": 1})
            _cut_replies_quoting(run, req.fragment_id)
            await _forget_swept_row(run, thread_id, made_in, *swept)
        elif thread_id is not None and made_in is not None:
            await _forget_failed_round_turns(run, thread_id, made_in, rows, running)
        if quotes and out.deleted:
            cut = _forget_pending_quotes(run, rows)
            if thread_id is None:
                # A round running when the forget came, or started while it deleted, may
                # have taken turns just cut: what it stores is swept once it is over.
                for record in (running, run.round_record):
                    if record is not None and record.thread_id in cut:
                        await _round_over(run, record)
                await _forget_stored_quotes(run, rows)
        if kept is not None and out.deleted:
            state_ops.drop_swept_row(run.state, req.fragment_id)
        return await _forgotten_everywhere(run, req, out)
    finally:
        # From here the state's forgotten ids keep a reinforce away from it; a forget that
        # failed leaves the fragment stored, and it is reinforced and kept as before.
        run.forgetting.discard(req.fragment_id)
        if thread_id is not None:
            run.held_threads[thread_id] -= 1
            if not run.held_threads[thread_id]:
                del run.held_threads[thread_id]
                run.dropped_ids.append(req.fragment_id)  # wake the loop: the thread may be due


def _cut_replies_quoting(run: UserRun, fragment_id: str) -> None:
    """A reply that read a forgotten fragment back and is still in an agent's outbox, or waits
    here for its round, loses the words it took from it (docs/ARCHITECTURE.md, "Invariants")."""
    state_ops.forgotten_with_quotes(run.state, fragment_id)
    if state_ops.replies_quoting(run.state, fragment_id) and run.patched(FORGET_COVERS_LATE_TURNS):
        state_ops.cut_replies_quoting(run.state, fragment_id)


def _forget_pending_quotes(run: UserRun, rows: list[Fragment]) -> set[str]:
    """Cut the forgotten rows out of every thread's pending turns that quote them (a reply
    that read a memory back, the "remember this" line a remembered fact came from): no round
    stores them again after the forget (docs/ARCHITECTURE.md, "Invariants"). Returns the
    threads whose turns were cut: a round of one of them running now may have taken them."""
    cut: set[str] = set()
    for row in rows:
        # A copy of one of its lines re-sent later without a time stamp is refused.
        state_ops.forgotten_lines(run.state, quoted_texts(row.content))
        for thread_id, ts in run.state.threads.items():
            if state_ops.forget_turns(run.state, thread_id, state_ops.quoting_parts(ts, row)):
                cut.add(thread_id)
    return cut


async def _forget_stored_quotes(run: UserRun, rows: list[Fragment]) -> None:
    """Cut the forgotten rows' words out of the other conversation rows that quote them: a
    round that stored the "remember this" line a remembered fact came from before the forget
    came, or was running with it in hand (waited for). Explicit memories are left alone."""
    for row in rows:
        if run.forget_request is not None:
            return  # the whole user is being forgotten: nothing of theirs is rewritten
        if not quoted_texts(row.content):
            continue  # nothing long enough to be a quote
        lines = ForgetLines(round_no=None, start_pos=0, end_pos=0, content=row.content, quotes=True)
        await _rewrite_rows(run, lines, "forget quotes of a forgotten row")


async def _delete(run: UserRun, inp: DeleteFragmentsInput, summary: str) -> DeleteFragmentsOutput:
    """The delete activity, counted as a write in flight (the forget saga waits for those).
    It heartbeats: a worker killed mid-forget is noticed after STORE_HEARTBEAT and another
    worker deletes again (idempotent), not after the store's start-to-close (60 s)."""
    run.writes_in_flight += 1
    try:
        return await workflow.execute_activity(
            ActivityName.DELETE_FRAGMENTS,
            inp,
            result_type=DeleteFragmentsOutput,
            **store_activity(summary, heartbeat=STORE_HEARTBEAT),
        )
    finally:
        run.writes_in_flight -= 1


async def _round_over(run: UserRun, record: RoundRecord) -> None:
    """Until the loop has put this round's outcome in the state."""
    await workflow.wait_condition(lambda: run.round_record is not record)


async def _forget_failed_round_turns(
    run: UserRun,
    thread_id: str,
    round_no: int,
    rows: list[Fragment],
    running: RoundRecord | None,
) -> None:
    """The forgotten row was made by the failed round `round_no` of `thread_id`: take what it
    quoted out of the pending turns, so no round slices it again. A round of the thread that
    was already running when the forget came (`running`) may have taken those turns: once it
    is over, the row's lines are taken out of what it stored for the same span."""
    for row in rows:
        ts = run.state.threads.get(thread_id)
        if ts is not None:
            parts = state_ops.forgotten_parts(ts, round_no, row)
            state_ops.forget_turns(run.state, thread_id, parts)
        if running is None:
            continue
        await _round_over(run, running)
        if running.round_no <= 0 or run.forget_request is not None:
            continue  # it never ran, or the whole user is being forgotten
        lines = ForgetLines(
            round_no=running.round_no,
            start_pos=row.start_pos,
            end_pos=row.end_pos,
            content=row.content,
        )
        await _rewrite_rows(run, lines, "forget a failed round's lines stored again")


async def _swept_row(
    run: UserRun, fragment_id: str, thread_id: str | None, running: RoundRecord | None
) -> tuple[int, Fragment] | None:
    """The forgotten row was not there to read: a round's sweep may have deleted it before the
    forget came (a retry of its failed round, running then, completed or failed since, in this
    run or an earlier one), and stored its lines again under the retry's ids. That round's
    number and the row as the workflow kept it (UserMemoryState.swept_rows) or the sweep found
    it, or None (docs/ARCHITECTURE.md, "The round")."""

    def found() -> tuple[int, Fragment] | None:
        kept = state_ops.swept_row(run.state, fragment_id)  # read before its sweep
        if kept is not None and kept.swept_by > 0:
            return kept.swept_by, state_ops.as_fragment(kept, run.inp.user_id)
        for round_no, rows in run.swept_rows.items():
            for row in rows:
                if row.id == fragment_id:
                    return round_no, row
        return None

    waits = thread_id is not None and running is not None
    if not waits and found() is None:
        return None
    if not run.patched(FORGET_SWEPT_ROW):
        return None
    if waits and running is not None:
        await _round_over(run, running)  # its result names the rows its sweep deleted
    return found()


async def _forget_swept_row(
    run: UserRun, thread_id: str | None, made_in: int | None, sweeper: int, row: Fragment
) -> None:
    """Take a swept row's lines out of what is left of its turns: the pending ones, if the
    round that swept it failed too, and the rows that round stored over the same span."""
    ts = run.state.threads.get(thread_id) if thread_id is not None else None
    if ts is not None and made_in is not None:
        state_ops.forget_turns(
            run.state, thread_id or "", state_ops.forgotten_parts(ts, made_in, row)
        )
    if run.forget_request is not None:
        return  # the whole user is being forgotten
    lines = ForgetLines(
        round_no=sweeper, start_pos=row.start_pos, end_pos=row.end_pos, content=row.content
    )
    await _rewrite_rows(run, lines, "forget a swept row's lines stored again")


async def _rewrite_rows(run: UserRun, lines: ForgetLines, summary: str) -> None:
    """Take a forgotten row's words out of the rows a round stored (`ForgetLines`): rows left
    with nothing are deleted, the others stored again; the state follows."""

    # One rewrite at a time, and none while a reinforce or an induction (which read rows
    # and write them, or facts from them, back) is in flight; they wait for it in turn.
    def busy() -> bool:
        return run.rewriting or run.reinforcing or run.inducting or run.publishing

    while busy():  # checked again on waking: others woken with it may have gone first
        await workflow.wait_condition(lambda: not busy())
    run.rewriting = True
    try:
        # Rows being forgotten meanwhile are left alone: a rewrite would put them back.
        lines.skip_ids = sorted(run.forgetting | set(run.state.forgotten_fragments))
        shown = state_ops.shown_with_lines(
            run.state, lines.content, lines.quotes, set(lines.skip_ids)
        )
        if shown and run.patched(FORGET_LINES_CHECKS_CONTEXT):
            lines.check_ids = shown
        again = await _delete(
            run,
            DeleteFragmentsInput(
                user_id=run.inp.user_id,
                ids=[],
                forget_lines=lines,
                epoch=run.state.forget_epoch,
            ),
            summary,
        )
        # A publish of the loop may have read the context meanwhile: its result would
        # put the old contents back.
        await workflow.wait_condition(lambda: not run.publishing)
        by_statement = run.patched(FORGET_FRAGMENT_BY_STATEMENT)
        gone, stale = list(again.deleted_ids), list(again.rewritten)
        if lines.check_ids and again.checked is not None:
            lost, shown_old = state_ops.after_lost_reply(
                run.state, lines.check_ids, gone, stale, again.checked
            )
            gone, stale = gone + lost, stale + shown_old
        for fid in gone:
            state_ops.forget_fragment_facts(run.state, fid, by_statement=by_statement)
            run.dropped_ids.append(fid)
        state_ops.rewritten(run.state, stale, by_statement=by_statement)
    finally:
        run.rewriting = False


async def _forgotten_everywhere(
    run: UserRun, req: ForgetFragmentRequest, out: DeleteFragmentsOutput
) -> ForgetFragmentResult:
    """After the delete: the induction batch, the profile facts and the read model."""
    run.dropped_ids.append(req.fragment_id)
    deleted = out.deleted
    if (
        not deleted
        and state_ops.mentions(run.state, req.fragment_id)
        and run.patched(FORGET_FRAGMENT_REPLY_LOST)
    ):
        # The row is gone but this attempt found nothing: an earlier attempt deleted it and its
        # reply was lost (the worker died after the delete). The state still names it: clean up.
        deleted = 1
    if not deleted or not run.patched(FORGET_FRAGMENT_REPUBLISHES):
        return ForgetFragmentResult(deleted=deleted)
    await workflow.wait_condition(lambda: not run.publishing)
    by_statement = run.patched(FORGET_FRAGMENT_BY_STATEMENT)
    queued = len(run.state.uninducted)
    removed = state_ops.forget_fragment_facts(run.state, req.fragment_id, by_statement=by_statement)
    if len(run.state.uninducted) > queued:
        # Fragments to induct again (they shared a fact that could not be told apart): wake
        # the loop, which may be asleep with nothing due.
        run.dropped_ids.append(req.fragment_id)
    republished = False
    if run.state.context is not None and run.forget_request is None:
        # The forget saga waits for writes in flight: this publish counts too, or a forget of
        # the whole user that came meanwhile could delete the read model before it lands (a
        # probe held this publish: the forgotten user's context came back to Redis).
        counted = run.patched(FORGET_FRAGMENT_PUBLISH_COUNTED)
        run.writes_in_flight += int(counted)
        try:
            # On failure the state holds it: the query and the next publish do.
            republished = await publish_held(run)
        finally:
            run.writes_in_flight -= int(counted)
    return ForgetFragmentResult(
        deleted=deleted, profile_facts_removed=removed, republished=republished
    )


def retry_round(run: UserRun, req: RetryRoundRequest) -> RetryRoundResult:
    """Re-run a failed round now; its messages are still pending, un-indexed.

    Works after any number of continue-as-new, unlike resetting the round's child workflow:
    the turns live in the user workflow's state, and a new round is started for them.
    """
    record = next(r for r in reversed(run.state.rounds) if r.event_id == req.event_id)
    ts = run.state.threads.get(record.thread_id)
    pending = len(ts.pending) if ts else 0
    if not pending:
        return RetryRoundResult(
            scheduled=False, thread_id=record.thread_id, reason="nothing left to retry"
        )
    run.retries.append(record.thread_id)
    return RetryRoundResult(scheduled=True, thread_id=record.thread_id, pending_turns=pending)


def validate_retry_round(run: UserRun, req: RetryRoundRequest) -> None:
    reject_while_forgetting(run)
    failed = [r for r in run.state.rounds if r.event_id == req.event_id]
    if not failed:
        raise ValueError(f"no recent round with event id {req.event_id!r}")
    if failed[-1].status != "failed":
        raise ValueError(f"round {failed[-1].round_no} did not fail ({failed[-1].status})")


def consolidate(run: UserRun, req: ConsolidateRequest) -> ConsolidateResult:
    """Make the thread's round due now; hand-overs received before this request count too."""
    run.consolidations.append(req.thread_id)
    ts = run.state.threads.get(req.thread_id)
    waiting = {turn_identity(t) for t in ts.pending} if ts else set()
    for event in run.submits:  # received, not yet absorbed: count those not accepted before
        for turn in event.turns:
            identity = turn_identity(turn)
            if turn.thread_id == req.thread_id and not (
                ts is not None and identity_digest(identity) in ts.seen
            ):
                waiting.add(identity)
    return ConsolidateResult(thread_id=req.thread_id, pending_turns=len(waiting))


def update_config(run: UserRun, req: ConfigUpdate) -> ConfigUpdateResult:
    """Queue the new config; the loop switches to it before it starts the next round."""
    config = (run.config_change or run.config).updated(req.vocation, req.params)
    run.config_change = config
    return ConfigUpdateResult(config=config)


def validate_update_config(run: UserRun, req: ConfigUpdate) -> None:
    reject_while_forgetting(run)
    (run.config_change or run.config).updated(req.vocation, req.params)  # raises ValueError


def reject_while_forgetting(run: UserRun) -> None:
    if run.forget_request is not None:
        raise ApplicationError("the user is being forgotten", type="InvalidInput")
