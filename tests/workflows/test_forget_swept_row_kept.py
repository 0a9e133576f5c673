"""A forget of a failed round's row that a retry's sweep deleted, where the retry's result is
not at hand (docs/ARCHITECTURE.md, "The round"): the user workflow continued as new since the
sweep, the retry failed too after its sweep, or the row's round left the thread's list of
failed rounds. The workflow reads the rows before the sweep and keeps what a forget needs of
them (UserMemoryState.swept_rows); each test counts the lines said against those stored."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.contracts import ForgetRequest, RoundRecord, UserStatus
from mnemoflow.workflows import state_ops
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import wait_status
from tests.support.invariants import said_vs_stored
from tests.support.memory_worker import memory_worker
from tests.support.operations import Forbidden
from tests.support.reliability import Ledger
from tests.support.replay import assert_replays
from tests.workflows.test_forget_failed_round_edges import (
    HOUR,
    fail_first,
    forget,
    kept_once,
    kit,
    retry,
    said,
    settled_counts,
    store_class,
    turns,
)

#: A history bound low enough that the workflow continues as new after the retry's round.
CAP = 50


def _running(s: UserStatus) -> bool:
    return any(r.status == "running" for r in s.rounds)


def _done(s: UserStatus, after: int) -> bool:
    return any(r.round_no > after and r.status == "completed" for r in s.rounds)


async def test_a_row_swept_before_a_continue_as_new_is_forgotten_from_the_retrys_rows(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    """The retry swept the failed round's rows and stored the same turns under its own ids;
    the workflow continued as new; then a row of the failed round is forgotten: its lines
    leave the retry's rows (the run that kept the retry's result is gone)."""
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"sweptcan-{uuid.uuid4().hex[:8]}"
        lines = said("sweptcan", 8)
        first = turns(lines, time.time() - 3 * HOUR, 0)
        handle, failed, rows = await fail_first(mw, user, first, max_history_events=CAP)
        victim = rows[0]
        gone = [x for x in lines if x in victim.content]
        assert gone
        before = (await handle.query(UserMemoryWorkflow.status)).continued
        await retry(handle, failed)
        status = await wait_status(
            handle, lambda s: _done(s, failed.round_no) and s.continued > before,
            deadline_s=90, what="the retry completed, then a continue-as-new",
        )  # fmt: skip
        assert await mw.store.get(user, [victim.id]) == [], "the retry swept the row"
        texts = [f.content for f in await mw.store.all_for_user(user)]
        assert all(any(x in t for t in texts) for x in gone), "its lines are stored again"
        result = await forget(handle, victim.id)
        now = [f.content for f in await mw.store.all_for_user(user)]
        back = sum(any(x in t for t in now) for x in gone)
        assert result.deleted == 1, result
        await settled_counts(mw, handle, user, lines, gone, turns_kept=len(lines))
        outcome = await kept_once(mw, user, lines, gone)
        await assert_replays(dev_env.client, [handle.id], name="forget-swept-row-after-can")
    reliability.record(
        request,
        key="forget-row-swept-before-continue-as-new",
        kind="fault",
        what="forget_fragment of a failed round's row that the retry had swept, after the user "
        f"workflow continued as new ({status.continued} times) since the sweep",
        happened=f"the row kept from before the sweep named its {len(gone)} lines, taken out "
        f"of the retry's rows (deleted={result.deleted}); forgotten lines back: {back}",
        outcome=outcome,
        started=started,
    )


async def _retry_fails_after_its_sweep(
    mw: Any, user: str, lines: list[str]
) -> tuple[Any, RoundRecord, list[str], str]:
    """The first round fails after its write; its retry sweeps its rows, writes its own and
    fails too. Returns the handle, the retry's record, the lines of the failed round's first
    row, and that row's id (swept, its lines in the retry's rows)."""
    handle, failed, rows = await fail_first(mw, user, turns(lines, time.time() - 3 * HOUR, 0))
    victim = rows[0]
    gone = [x for x in lines if x in victim.content]
    assert gone
    kit(mw).failures[user] = 1
    await retry(handle, failed)
    status = await wait_status(
        handle, lambda s: s.rounds_failed >= 2 and not any(r.status == "running" for r in s.rounds),
        deadline_s=90, what="the retry failed after its sweep",
    )  # fmt: skip
    second = next(r for r in status.rounds if r.round_no > failed.round_no)
    assert second.status == "failed", second
    store = mw.store
    assert await store.get(user, [victim.id]) == [], "the retry swept the row"
    again = [f.content for f in await store.all_for_user(user) if f.round_no == second.round_no]
    assert all(any(x in t for t in again) for x in gone), "the retry stored its lines again"
    return handle, second, gone, victim.id


@pytest.mark.parametrize("listed", ["listed", "left the list"])
async def test_a_row_swept_by_a_retry_that_failed_too_stays_forgotten(
    listed: str,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The retry swept the failed round's rows, stored its own and failed: it handed nothing
    back. A row of the first round is forgotten, then the next retry runs: the forgotten lines
    are nowhere, every other line is stored once. "left the list": the thread keeps one failed
    round (the workflow reads the bound from the state_ops module), so the first round left
    its list when the retry failed and the row would be forgotten as a plain one."""
    if listed != "listed":
        monkeypatch.setattr(state_ops, "MAX_FAILED_ROUNDS", 1)
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"sweptfail-{uuid.uuid4().hex[:8]}"
        lines = said(f"sweptfail {listed}", 8)
        handle, second, gone, victim = await _retry_fails_after_its_sweep(mw, user, lines)
        result = await forget(handle, victim)
        assert result.deleted == 1, result
        await retry(handle, second)
        await settled_counts(mw, handle, user, lines, gone)
        stored = [f.content for f in await mw.store.all_for_user(user)]
        back = sum(any(x in t for t in stored) for x in gone)
        outcome = await kept_once(mw, user, lines, gone)
        await assert_replays(dev_env.client, [handle.id], name=f"forget-swept-row-{listed}")
    reliability.record(
        request,
        key=f"forget-row-swept-by-failed-retry-{listed.replace(' ', '-')}",
        kind="fault",
        what="forget_fragment of a failed round's row that a retry swept before it failed too "
        + ("" if listed == "listed" else "(the row's round had left the thread's list) ")
        + "then the next retry",
        happened=f"the row kept from before the sweep named its {len(gone)} lines: cut from "
        f"the pending turns and the failed retry's rows (deleted={result.deleted}); forgotten "
        f"lines back after the next retry: {back}",
        outcome=outcome,
        started=started,
    )


async def test_a_lost_reply_of_the_rewrite_leaves_no_forgotten_line_in_the_context(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    """As above, and the delete of the retry's rows that the forgotten lines emptied is done
    but its reply lost: the retried rewrite finds nothing left to do, yet the published
    context no longer shows those rows (they were in the retry's selection)."""
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"sweptlost-{uuid.uuid4().hex[:8]}"
        lines = said("sweptlost", 8)
        first = turns(lines, time.time() - 3 * HOUR, 0)
        handle, failed, rows = await fail_first(mw, user, first)
        victim = rows[0]
        gone = [x for x in lines if x in victim.content]
        await retry(handle, failed)
        await wait_status(handle, lambda s: _done(s, failed.round_no), what="the retry completed")
        again = [
            f for f in await mw.store.all_for_user(user)
            if f.round_no != failed.round_no and any(x in f.content for x in gone)
        ]  # fmt: skip
        published = await mw.read_model.get(user)
        assert published is not None
        shown = {f.id for f in published.fragments}
        assert shown & {f.id for f in again}, "the retry's rows with the lines are not shown"
        kit(mw).lose_reply = {f.id for f in again}
        result = await forget(handle, victim.id)
        assert not kit(mw).lose_reply, "no reply was lost: nothing tested"
        assert result.deleted == 1, result
        await settled_counts(mw, handle, user, lines, gone, turns_kept=len(lines))
        published = await mw.read_model.get(user)
        assert published is not None
        shown_back = sum(any(x in f.content for f in published.fragments) for x in gone)
        outcome = await kept_once(mw, user, lines, gone)
        await assert_replays(dev_env.client, [handle.id], name="forget-lines-reply-lost")
    reliability.record(
        request,
        key="forget-lines-reply-lost",
        kind="fault",
        what="forget_fragment of a swept row whose rewrite of the retry's rows deleted them and "
        "lost its reply (the retried call found nothing left to do)",
        happened=f"forgotten lines shown in the published context after it: {shown_back}",
        outcome=outcome,
        started=started,
    )


async def test_a_whole_user_forget_during_the_read_before_a_sweep_starts_no_round(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    """The workflow is reading the rows the retry will sweep when the user is forgotten: the
    retry is not started (it would run to its end before the forget), the receipt counts it
    cancelled, and nothing the user said is stored."""
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"sweptall-{uuid.uuid4().hex[:8]}"
        lines = said("sweptall", 8)
        handle, failed, _ = await fail_first(mw, user, turns(lines, time.time() - 3 * HOUR, 0))
        store = kit(mw)
        store.hold, store.reached = asyncio.Event(), asyncio.Event()
        await retry(handle, failed)
        await asyncio.wait_for(store.reached.wait(), 60)  # the read of the rows to sweep
        pending = await handle.start_update(
            UserMemoryWorkflow.forget, ForgetRequest(), wait_for_stage=WorkflowUpdateStage.ACCEPTED
        )
        store.hold.set()
        receipt = await asyncio.wait_for(pending.result(), 60)
        status = await handle.query(UserMemoryWorkflow.status)
        assert receipt.rounds_cancelled == 1, receipt
        assert not any(r.round_no > failed.round_no for r in status.rounds if r.fragments), status
        outcome = await said_vs_stored(mw.store, user, None, {"t": []}, forgotten=lines)
        assert outcome.clean, outcome
        await assert_replays(dev_env.client, [handle.id], name="forget-during-sweep-read")
    reliability.record(
        request,
        key="forget-user-during-sweep-read",
        kind="fault",
        what="whole-user forget while the workflow read the rows a retry was to sweep",
        happened=f"rounds cancelled: {receipt.rounds_cancelled}; the retry never started",
        outcome=outcome,
        started=started,
    )


class SliceDown(HeuristicMemoryModels):
    """Rejects every slice while `down` (the round fails before its store step)."""

    down = False

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        if self.down:
            raise Forbidden("memory model down (test)")
        return await super().slice(turns, max_fragments)


async def test_a_row_of_a_round_that_left_the_list_unswept_stays_forgotten(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread keeps one failed round (the workflow reads the bound from the state_ops
    module). The first round fails after its write; its retry fails before its store step, so
    the first round's rows are never swept and the round leaves the thread's list. A row of it
    is forgotten, then the next retry stores the thread's turns: none of the forgotten lines
    comes back. (The first round's other rows stay stored beside the retry's: rows of a round
    that left the list are not swept, `state_ops.MAX_FAILED_ROUNDS`; only the forgotten lines
    are counted here.)"""
    monkeypatch.setattr(state_ops, "MAX_FAILED_ROUNDS", 1)
    started = time.monotonic()
    models = SliceDown()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=models, store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"sweptleft-{uuid.uuid4().hex[:8]}"
        lines = said("sweptleft", 8)
        handle, failed, rows = await fail_first(mw, user, turns(lines, time.time() - 3 * HOUR, 0))
        victim = rows[0]
        gone = [x for x in lines if x in victim.content]
        assert gone
        models.down = True
        await retry(handle, failed)
        status = await wait_status(
            handle, lambda s: s.rounds_failed >= 2 and not _running(s),
            deadline_s=90, what="the retry failed before its store step",
        )  # fmt: skip
        second = next(r for r in status.rounds if r.round_no > failed.round_no)
        assert await mw.store.get(user, [victim.id]), "the row was swept: nothing tested"
        result = await forget(handle, victim.id)
        assert result.deleted == 1, result
        models.down = False
        await retry(handle, second)
        await wait_status(
            handle, lambda s: _done(s, second.round_no) and s.pending_turns == 0,
            deadline_s=90, what="the next retry stored the turns",
        )  # fmt: skip
        stored = [f.content for f in await mw.store.all_for_user(user)]
        back = sum(any(x in t for t in stored) for x in gone)
        outcome = await said_vs_stored(mw.store, user, None, {"t": []}, forgotten=gone)
        assert outcome.clean, outcome
        await assert_replays(dev_env.client, [handle.id], name="forget-row-left-the-list")
    reliability.record(
        request,
        key="forget-row-of-round-that-left-the-list-unswept",
        kind="fault",
        what="forget_fragment of a row of a failed round that left the thread's list of failed "
        "rounds unswept (its retry failed before its store step), then the next retry",
        happened=f"the row kept from the read before the failed retry named its thread: its "
        f"{len(gone)} turns were cut from the pending ones; forgotten lines back: {back}",
        outcome=outcome,
        started=started,
    )
