"""A round that stored its fragments and then failed for good leaves rows no completed round
owns (docs/ARCHITECTURE.md, "The round"). Its turns stay pending, and the round that re-slices
them replaces those rows: without that, its fragments were skipped as repeats of the failed
round's rows, which the user workflow never learned of (never inducted, never counted)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

from temporalio.client import WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ForgetFragmentRequest, RetryRoundRequest, UserStatus
from mnemoflow.models.errors import InvalidInputError
from mnemoflow.models.fragments import Fragment
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, submit, wait_status
from tests.support.invariants import indexed_once
from tests.support.memory_worker import memory_worker

CONFIG = MemoryConfig.from_vocation("customer service").model_copy(
    update={"failed_round_backoff_s": 0.0}
)
HOUR = 3600.0


class FailsAfterWrite(FragmentStore):
    """The production store whose store step fails for good after its upsert: the read of the
    candidates that follows the write refuses, `failures[user]` more times."""

    failures: ClassVar[dict[str, int]] = {}

    async def candidates(self, user_id: str, *args: Any, **kwargs: Any) -> Any:
        left = type(self).failures.get(user_id, 0)
        if left > 0:
            type(self).failures[user_id] = left - 1
            raise InvalidInputError("the store step fails for good after its write (test)")
        return await super().candidates(user_id, *args, **kwargs)


def lines_of(thread: str, n: int) -> list[str]:
    """Distinct lines: each names its thread, its place and a number of its own."""
    return [
        f"In {thread} note {i}: parcel {4000 + 37 * i} goes to dock {i % 5} on day {i + 2}."
        if i % 2 == 0
        else f"Understood about parcel {4000 + 37 * (i - 1)} in {thread}."
        for i in range(n)
    ]


async def test_a_round_that_failed_after_its_write_leaves_no_rows_behind(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    class Store(FailsAfterWrite):
        failures: ClassVar[dict[str, int]] = {}

    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=Store,
    ) as mw:  # fmt: skip
        user = f"failrows-{uuid.uuid4().hex[:8]}"
        t0 = time.time() - 2 * HOUR
        said = {"a": lines_of("thread a", 6), "b": lines_of("thread b", 4)}
        # Two rounds of thread a fail after writing; then its third attempt completes.
        Store.failures[user] = 2
        handle = await submit(
            mw.client, mw.task_queue, user, conversation("a", said["a"], t0), urgent=True,
            config=CONFIG,
        )  # fmt: skip

        def settled(s: UserStatus) -> bool:
            return s.watermarks.get("a") is not None and s.watermarks["a"].indexed >= 6

        status = await wait_status(handle, settled, deadline_s=90, what="thread a indexed")
        assert status.rounds_failed == 2, status.last_error
        # Another thread's round afterwards: it must not touch what thread a's round stored.
        await submit(
            mw.client, mw.task_queue, user, conversation("b", said["b"], t0 + 600), urgent=True,
            config=CONFIG,
        )  # fmt: skip
        status = await wait_status(
            handle,
            lambda s: s.watermarks.get("b") is not None and s.watermarks["b"].indexed >= 4,
            deadline_s=90,
            what="thread b indexed",
        )
        outcome = await indexed_once(mw.store, user, status, {"a": 6, "b": 4})
        assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
        stored = await mw.store.all_for_user(user)
        completed = {r.round_no: r.fragments for r in status.rounds if r.status == "completed"}
        # Every row belongs to a completed round, which counted it (so induction reads it).
        assert Counter(f.round_no for f in stored) == Counter(
            {no: n for no, n in completed.items() if n}
        )
        # The per-call search's lines are those of the same rows, the failed rounds' ones gone.
        assert await mw.store.lined_ids(user) == {f.id for f in stored}
        # Each line said is stored exactly once.
        for lines in said.values():
            for line in lines:
                held = sum(f.content.count(line) for f in stored)
                assert held == 1, (line, held)
        await wait_status(handle, lambda s: s.uninducted == 0, deadline_s=90, what="inducted")


class HeldSweep(FailsAfterWrite):
    """FailsAfterWrite whose next read of a user's rows of some rounds (the sweep that opens a
    round's store step) waits for the test once `hold` is armed; `pass_reads` reads go first
    (the workflow's read of the rows to sweep, before the round starts)."""

    failures: ClassVar[dict[str, int]] = {}
    hold: ClassVar[asyncio.Event | None] = None
    reached: ClassVar[asyncio.Event | None] = None
    pass_reads: ClassVar[int] = 0

    async def of_rounds(self, user_id: str, rounds: Sequence[int]) -> list[Fragment]:
        cls = type(self)
        hold, reached = cls.hold, cls.reached
        if hold is not None and reached is not None and not reached.is_set():
            if cls.pass_reads > 0:
                cls.pass_reads -= 1
            else:
                reached.set()
                await hold.wait()
        return await super().of_rounds(user_id, rounds)


async def _forget_a_row_of_a_failed_round(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    *,
    while_its_thread_runs: bool,
) -> None:
    """The round fails after its write; a row of it (searchable) is forgotten; the operator
    retries the round (with `while_its_thread_runs`, the retry is already inside its store step
    when the forget comes); then more is said. The forgotten lines never come back; every
    other line is stored once; the counts say what happened."""

    class Store(HeldSweep):
        failures: ClassVar[dict[str, int]] = {}
        hold = None
        reached = None

    config = CONFIG.model_copy(update={"failed_round_backoff_s": 3600.0})
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=Store,
    ) as mw:  # fmt: skip
        user = f"failforget-{uuid.uuid4().hex[:8]}"
        t0 = time.time() - 2 * HOUR
        said = lines_of("thread f", 12)
        Store.failures[user] = 1
        handle = await submit(
            mw.client, mw.task_queue, user, conversation("f", said, t0), urgent=True,
            config=config,
        )  # fmt: skip
        status = await wait_status(
            handle, lambda s: s.rounds_failed >= 1, deadline_s=90, what="the round failed"
        )
        rows = await mw.store.all_for_user(user)
        assert len(rows) >= 2, f"the failed round stored {len(rows)} rows: nothing to keep"
        victim = rows[0]
        gone = [line for line in said if line in victim.content]
        kept = [line for line in said if line not in gone]
        assert gone and kept
        failed = next(r for r in status.rounds if r.status == "failed")
        forget = ForgetFragmentRequest(fragment_id=victim.id)
        if while_its_thread_runs:
            Store.hold, Store.reached = asyncio.Event(), asyncio.Event()
            Store.pass_reads = 1
            await handle.execute_update(
                UserMemoryWorkflow.retry_round, RetryRoundRequest(event_id=failed.event_id)
            )
            await asyncio.wait_for(Store.reached.wait(), 60)  # the retry is in its store step
            pending = await handle.start_update(
                UserMemoryWorkflow.forget_fragment,
                forget,
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            )
            deadline = time.monotonic() + 60
            while await mw.store.get(user, [victim.id]):
                assert time.monotonic() < deadline, "the forget never deleted the row"
                await asyncio.sleep(0.05)
            Store.hold.set()  # the retry now stores the batch it took, forgotten turns included
            out = await pending.result()
        else:
            out = await handle.execute_update(UserMemoryWorkflow.forget_fragment, forget)
            await handle.execute_update(
                UserMemoryWorkflow.retry_round, RetryRoundRequest(event_id=failed.event_id)
            )
        assert out.deleted == 1
        later = lines_of("thread f later", 4)
        await submit(
            mw.client, mw.task_queue, user,
            [t.model_copy(update={"position": 12 + t.position})
             for t in conversation("f", later, t0 + 3600)],
            urgent=True, config=config,
        )  # fmt: skip
        expected = len(kept) + len(later)

        def settled(s: UserStatus) -> bool:
            mark = s.watermarks.get("f")
            return mark is not None and mark.pending_since is None and mark.indexed >= expected

        status = await wait_status(handle, settled, deadline_s=90, what="the rest indexed")
        stored = await mw.store.all_for_user(user)
        texts = [f.content for f in stored]
        for line in gone:
            assert not any(line in t for t in texts), f"forgotten line stored again: {line}"
        for line in [*kept, *later]:
            assert sum(t.count(line) for t in texts) == 1, line
        # The forgotten turns left the counts; the rest were indexed once each.
        mark = status.watermarks["f"]
        assert (mark.accepted, mark.indexed) == (expected, expected), mark
        assert await mw.store.lined_ids(user) == {f.id for f in stored}
        published = await mw.read_model.get(user)
        assert published is not None
        for line in gone:
            assert not any(line in f.content for f in published.fragments), line


async def test_a_forgotten_row_of_a_failed_round_is_not_stored_again(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    await _forget_a_row_of_a_failed_round(
        dev_env, milvus_uri, redis_url, while_its_thread_runs=False
    )


async def test_a_forgotten_row_of_a_failed_round_stays_forgotten_when_its_retry_is_running(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    await _forget_a_row_of_a_failed_round(
        dev_env, milvus_uri, redis_url, while_its_thread_runs=True
    )
