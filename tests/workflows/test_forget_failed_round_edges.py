"""Forgetting a row of a round that failed after its write, at the edges (docs/ARCHITECTURE.md,
"The round"): a long turn cut across rows, turns delivered late, a retry already running that
slices the turns differently, another writer numbering its turns alike, a delete whose reply
is lost. Every line is distinct; each test counts what was said against what Milvus (fragments
and the per-call search's lines), the read model and the watermarks hold."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
    ForgetFragmentRequest,
    ForgetFragmentResult,
    RetryRoundRequest,
    RoundRecord,
    UserStatus,
)
from mnemoflow.models.errors import InvalidInputError
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.turns import ChatTurn
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import submit, wait_status
from tests.support.invariants import Outcome, said_vs_stored
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger
from tests.support.replay import assert_replays

HOUR = 3600.0
CONFIG = MemoryConfig.from_vocation("customer service").model_copy(
    update={"failed_round_backoff_s": HOUR, "max_turns_per_round": 4}
)
TAIL = (
    " The courier confirmed the pallet count, the loading bay, the seal number and the"
    " signature of the night shift supervisor for this shipment before it left the yard"
)


def said(tag: str, n: int, base: int = 0) -> list[str]:
    """Distinct lines, long enough that the offline slicer keeps about two turns a row."""
    return [
        f"Line {tag}-{i:03d}: parcel {7000 + 41 * i} to dock {i % 7}.{TAIL} ({tag} {i})."
        for i in range(base, base + n)
    ]


def turns(texts: list[str], t0: float, pos0: int) -> list[ChatTurn]:
    return [
        ChatTurn(
            thread_id="f",
            position=pos0 + i,
            role="human" if (pos0 + i) % 2 == 0 else "ai",
            content=text,
            time=t0 + i * 35.0,
        )
        for i, text in enumerate(texts)
    ]


class Store(FragmentStore):
    """The production store whose store step fails for good after its write (`failures`); whose
    next read of all of a user's rows (a round's sweep) waits for the test once `arm`ed; and
    whose deletes of `lose_reply` ids succeed and then raise, once (a reply lost)."""

    failures: ClassVar[dict[str, int]] = {}
    hold: ClassVar[asyncio.Event | None] = None
    reached: ClassVar[asyncio.Event | None] = None
    lose_reply: ClassVar[set[str]] = set()
    # Reads of all of a user's rows let through before the one held.
    pass_reads: ClassVar[int] = 0
    # Hold the next selection (a round's store step after its sweep and its write).
    hold_selection: ClassVar[asyncio.Event | None] = None
    selecting: ClassVar[asyncio.Event | None] = None

    async def candidates(self, user_id: str, *args: Any, **kwargs: Any) -> Any:
        cls = type(self)
        if cls.hold_selection is not None and cls.selecting is not None:
            if not cls.selecting.is_set():
                cls.selecting.set()
                await cls.hold_selection.wait()
        if type(self).failures.get(user_id, 0) > 0:
            type(self).failures[user_id] -= 1
            raise InvalidInputError("the store step fails for good after its write (test)")
        return await super().candidates(user_id, *args, **kwargs)

    async def of_rounds(self, user_id: str, rounds: Sequence[int]) -> list[Fragment]:
        cls = type(self)
        if cls.hold is not None and cls.reached is not None and not cls.reached.is_set():
            if cls.pass_reads > 0:  # the workflow's read of the rows to sweep, before the round
                cls.pass_reads -= 1
            else:
                cls.reached.set()
                await cls.hold.wait()
        return await super().of_rounds(user_id, rounds)

    async def delete(self, user_id: str, ids: list[str]) -> int:
        deleted = await super().delete(user_id, ids)
        lost = type(self).lose_reply & set(ids)
        if lost:
            type(self).lose_reply -= lost
            raise ConnectionResetError("the reply of a delete that was done is lost (test)")
        return deleted


def store_class() -> type[Store]:
    class Fresh(Store):
        failures: ClassVar[dict[str, int]] = {}
        hold = None
        reached = None
        lose_reply: ClassVar[set[str]] = set()
        pass_reads = 0
        hold_selection = None
        selecting = None

    return Fresh


def kit(mw: Any) -> type[Store]:
    """The worker's store class (its test switches)."""
    return cast(type[Store], type(mw.store))


async def fail_first(
    mw: Any, user: str, first: list[ChatTurn], max_history_events: int = 10_000
) -> tuple[Any, RoundRecord, list[Fragment]]:
    """The user's first round fails after its write; its record and rows, in span order."""
    kit(mw).failures[user] = 1
    handle = await submit(
        mw.client, mw.task_queue, user, first, event_id="first", urgent=True, config=CONFIG,
        max_history_events=max_history_events,
    )  # fmt: skip
    status = await wait_status(handle, lambda s: s.rounds_failed >= 1, deadline_s=90, what="fail")
    failed = next(r for r in status.rounds if r.status == "failed")
    rows = [f for f in await mw.store.all_for_user(user) if f.round_no == failed.round_no]
    assert len(rows) >= 2, f"the failed round stored {len(rows)} rows: nothing to keep"
    return handle, failed, sorted(rows, key=lambda f: f.start_pos)


async def deliver(mw: Any, handle: WorkflowHandle, user: str, late: list[ChatTurn]) -> None:
    before = (await handle.query(UserMemoryWorkflow.status)).watermarks["f"].accepted
    await submit(mw.client, mw.task_queue, user, late, event_id="late", urgent=True, config=CONFIG)
    await wait_status(
        handle, lambda s: s.watermarks["f"].accepted >= before + len(late), deadline_s=30,
        what="late turns accepted",
    )  # fmt: skip


async def forget(handle: WorkflowHandle, fid: str) -> ForgetFragmentResult:
    return await handle.execute_update(
        UserMemoryWorkflow.forget_fragment, ForgetFragmentRequest(fragment_id=fid)
    )


async def retry(handle: WorkflowHandle, failed: RoundRecord) -> None:
    await handle.execute_update(
        UserMemoryWorkflow.retry_round, RetryRoundRequest(event_id=failed.event_id)
    )


async def kept_once(mw: Any, user: str, lines: list[str], gone: list[str]) -> Outcome:
    """Every line but the forgotten ones stored once, none of `gone` anywhere (asserted); the
    checker's outcome, for the ledger."""
    outcome = await said_vs_stored(
        mw.store, user, None, {"t": [x for x in lines if x not in gone]}, forgotten=gone
    )
    assert outcome.clean, outcome
    return outcome


async def settled_counts(
    mw: Any,
    handle: WorkflowHandle,
    user: str,
    lines: list[str],
    gone: list[str],
    turns_kept: int | None = None,
) -> None:
    """Once the thread is settled: forgotten lines nowhere, every other line stored once, the
    lines held for Milvus's ids, and the watermark counting the turns kept (one a line unless
    `turns_kept` says otherwise)."""

    def settled(s: UserStatus) -> bool:
        mark = s.watermarks.get("f")
        running = any(r.status == "running" for r in s.rounds)
        return mark is not None and mark.pending_since is None and not running

    status = await wait_status(handle, settled, deadline_s=90, what="the thread settled")
    stored = await mw.store.all_for_user(user)
    texts = [f.content for f in stored]
    back = [x for x in gone if any(x in t for t in texts)]
    counts = {x: sum(t.count(x) for t in texts) for x in lines if x not in gone}
    assert not back, f"forgotten lines stored again: {back}"
    assert all(n == 1 for n in counts.values()), {x: n for x, n in counts.items() if n != 1}
    assert await mw.store.lined_ids(user) == {f.id for f in stored}
    published = await mw.read_model.get(user)
    assert published is not None
    assert not [x for x in gone if any(x in f.content for f in published.fragments)]
    mark, kept = status.watermarks["f"], len(counts) if turns_kept is None else turns_kept
    assert (mark.accepted, mark.indexed) == (kept, kept), mark


async def test_a_forgotten_piece_of_a_long_turn_stays_forgotten_and_its_other_pieces_stay(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """A turn over the slicer's bound is cut into pieces, a row each; the row with the first
    piece is forgotten: that piece never comes back, the turn's other pieces are stored."""
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"longturn-{uuid.uuid4().hex[:8]}"
        sentences = [
            f"Sentence {k:02d} of the long turn: crate {900 + k} holds {k + 3} gearboxes for"
            f" zone {k % 4}, checked by inspector {k * 7 + 11}."
            for k in range(24)
        ]
        lines = [*said("lg", 1), " ".join(sentences), *said("lg", 2, base=10)]
        handle, failed, rows = await fail_first(mw, user, turns(lines, time.time() - 3 * HOUR, 0))
        victim = next(f for f in rows if sentences[0] in f.content)
        gone = [x for x in sentences if x in victim.content]
        assert 0 < len(gone) < len(sentences)
        assert (await forget(handle, victim.id)).deleted == 1
        await retry(handle, failed)
        kept = [x for x in sentences if x not in gone]
        every = [*kept, *gone, lines[0], *lines[2:]]
        await settled_counts(mw, handle, user, every, gone, turns_kept=len(lines))


async def test_a_late_turn_the_failed_round_never_took_is_kept(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """The round took positions 0, 1, 2 and 4; position 3 arrived later, its words all inside
    turn 4's. The row holding turn 4 is forgotten: turn 3 was never in it and is stored."""
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"lateshort-{uuid.uuid4().hex[:8]}"
        lines = said("sh", 8)
        lines[3] = "See you at dock four tomorrow."
        lines[4] = "Thanks, see you at dock four tomorrow, and bring the release for parcel 7164."
        every = turns(lines, time.time() - 3 * HOUR, 0)
        handle, failed, rows = await fail_first(mw, user, every[:3] + every[4:])
        await deliver(mw, handle, user, [every[3]])
        victim = next(f for f in rows if lines[4] in f.content)
        gone = [x for x in lines if x in victim.content and x != lines[3]]
        assert (await forget(handle, victim.id)).deleted == 1
        await retry(handle, failed)
        await settled_counts(mw, handle, user, lines, gone)


async def _forget_while_the_retry_runs(
    mw: Any, user: str, first: list[ChatTurn], late: list[ChatTurn]
) -> tuple[Any, list[str]]:
    """The first round fails after its write; `late` turns arrive; the retry is held in its
    store step before its sweep while the first row of the failed round is forgotten; then the
    retry goes on. Returns the handle and the forgotten lines."""
    handle, failed, rows = await fail_first(mw, user, first)
    await deliver(mw, handle, user, late)
    victim = rows[0]
    gone = [t.content for t in first if t.content in victim.content]
    store = kit(mw)
    store.hold, store.reached = asyncio.Event(), asyncio.Event()
    store.pass_reads = 1  # the workflow reads the rows to sweep before the retry starts
    await retry(handle, failed)
    await asyncio.wait_for(store.reached.wait(), 60)
    pending = await handle.start_update(
        UserMemoryWorkflow.forget_fragment,
        ForgetFragmentRequest(fragment_id=victim.id),
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
    )
    deadline = time.monotonic() + 60
    while await mw.store.get(user, [victim.id]):  # the forget deletes it before the sweep
        assert time.monotonic() < deadline, "the forget never deleted the row"
        await asyncio.sleep(0.05)
    store.hold.set()
    assert (await asyncio.wait_for(pending.result(), 60)).deleted == 1
    return handle, gone


async def test_a_running_retry_that_slices_differently_stores_no_forgotten_line(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """A turn said before the failed round's first arrives late, so the retry (already in its
    store step when the forget comes) takes another batch and cuts other rows: the forgotten
    lines are taken out of those rows, the other lines stay."""
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"shifted-{uuid.uuid4().hex[:8]}"
        t0 = time.time() - 3 * HOUR
        first, late = said("shift a", 8, base=10), said("shift b", 1, base=9)
        handle, gone = await _forget_while_the_retry_runs(
            mw, user, turns(first, t0, 10), turns(late, t0 - 1000, 9)
        )
        await settled_counts(mw, handle, user, [*first, *late], gone)


async def test_another_writers_turns_numbered_alike_are_kept(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """Another writer's turns, numbered from 0 as well and said earlier, arrive late and are
    what the running retry takes: none of them is lost to the forget of the failed round's row
    at the same positions."""
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"alike-{uuid.uuid4().hex[:8]}"
        t0 = time.time() - 3 * HOUR
        first, other = said("alike a", 8), said("alike b", 4)
        handle, gone = await _forget_while_the_retry_runs(
            mw, user, turns(first, t0, 0), turns(other, t0 - 1000, 0)
        )
        await settled_counts(mw, handle, user, [*first, *other], gone)


async def test_a_lost_delete_reply_still_takes_the_forgotten_turns_out(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """The forget's delete is done and its reply lost; the retried delete finds nothing. The
    row was read before: the forget still answers deleted=1 and its lines never come back."""
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"lostreply-{uuid.uuid4().hex[:8]}"
        lines = said("lost", 8)
        handle, failed, rows = await fail_first(mw, user, turns(lines, time.time() - 3 * HOUR, 0))
        victim = rows[0]
        kit(mw).lose_reply = {victim.id}
        assert (await forget(handle, victim.id)).deleted == 1
        assert not kit(mw).lose_reply, "no reply was lost: nothing tested"
        await retry(handle, failed)
        await settled_counts(mw, handle, user, lines, [x for x in lines if x in victim.content])


async def test_a_row_the_running_retry_already_swept_is_forgotten_from_its_rows(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    """The retry of the failed round has swept the failed round's rows and stored its own (held
    in its selection) when a row of the failed round is forgotten: the row is not there to
    read any more, yet its lines leave the retry's rows, and the forget says it deleted it."""
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=store_class(),
    ) as mw:  # fmt: skip
        user = f"swept-{uuid.uuid4().hex[:8]}"
        lines = said("swept", 8)
        handle, failed, rows = await fail_first(mw, user, turns(lines, time.time() - 3 * HOUR, 0))
        victim = rows[0]
        gone = [x for x in lines if x in victim.content]
        assert gone
        store = kit(mw)
        store.hold_selection, store.selecting = asyncio.Event(), asyncio.Event()
        await retry(handle, failed)
        await asyncio.wait_for(store.selecting.wait(), 60)  # swept, written, now selecting
        assert await mw.store.get(user, [victim.id]) == [], "the retry swept the row"
        stored_again = [
            f for f in await mw.store.all_for_user(user) if f.round_no != failed.round_no
        ]
        assert any(x in f.content for f in stored_again for x in gone), "its lines are back"
        pending = await handle.start_update(
            UserMemoryWorkflow.forget_fragment,
            ForgetFragmentRequest(fragment_id=victim.id),
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        )
        store.hold_selection.set()
        result = await asyncio.wait_for(pending.result(), 60)
        stored = [f.content for f in await mw.store.all_for_user(user)]
        back = sum(any(x in t for t in stored) for x in gone)
        assert result.deleted == 1, result
        # The retry had indexed the turns before the forget came: they stay counted, as after
        # a forget of any indexed row.
        await settled_counts(mw, handle, user, lines, gone, turns_kept=len(lines))
        outcome = await kept_once(mw, user, lines, gone)
        await assert_replays(dev_env.client, [handle.id], name="forget-swept-row")
    reliability.record(
        request,
        key="forget-row-swept-by-running-retry",
        kind="fault",
        what="forget_fragment of a failed round's row after the running retry had swept it and "
        "stored the same turns under its own ids",
        happened=f"the forget waited for the retry and took the row's {len(gone)} lines out of "
        f"the rows it stored (deleted={result.deleted}); forgotten lines back: {back}",
        outcome=outcome,
        started=started,
    )
