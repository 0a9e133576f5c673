"""Events arriving while the user workflow continues-as-new: a storm of concurrent hand-overs on
the dev server (real time, so signals really race the continue-as-new), history capped at 50
events so it continues-as-new several times. Every turn is indexed exactly once.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from tests.support.drive import conversation, submit, wait_status
from tests.support.invariants import Monotonic, indexed_once
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger

pytestmark = pytest.mark.integration

TURNS = 40
WAVE = 4


async def test_signal_storm_across_continue_as_new(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"storm-{uuid.uuid4().hex[:8]}"
        lines = [
            f"Detail {i}: my locker code number {1000 + i} is important." for i in range(TURNS)
        ]
        turns = conversation("t", lines, time.time() - 3 * 3600, step=5.0)
        handle = await submit(client, mw.task_queue, user, turns[:1], max_history_events=50)

        watch = Monotonic()

        async def sender(order: list) -> None:
            for turn in order:
                await submit(client, mw.task_queue, user, [turn], max_history_events=50)

        # Waves of one event per turn from two senders at once (one backwards), so each turn
        # arrives twice. A wave goes out once the previous one is indexed and inducted: the
        # workflow is then idle past its history cap, continuing-as-new as the signals arrive.
        sent_after_continue = 0
        for lo in range(0, TURNS, WAVE):
            wave = turns[lo : lo + WAVE]
            await asyncio.gather(sender(wave), sender(wave[::-1]))
            seen = await wait_status(
                handle,
                lambda s, end=lo + len(wave): (
                    watch.see(s) and s.watermarks["t"].indexed >= end and s.uninducted == 0
                ),
                what="wave indexed",
            )
            sent_after_continue += seen.continued >= 1
        done = await wait_status(
            handle,
            lambda s: watch.see(s) and s.pending_turns + s.pending_events == 0 and s.continued >= 1,
            deadline_s=90,
            what="every turn indexed",
        )
        assert done.continued >= 1 and sent_after_continue >= 1, "no continue-as-new crossed"
        assert done.watermarks["t"].accepted == TURNS and done.rounds_failed == 0
        outcome = await indexed_once(mw.store, user, done, {"t": TURNS})
        assert (outcome.lost, outcome.duplicated) == (0, 0), (
            outcome,
            [(r.round_no, r.start, r.end, r.status, r.fragments) for r in done.rounds],
            done.watermarks,
            sorted((f.round_no, f.start_pos, f.end_pos) for f in await mw.store.all_for_user(user)),
        )
    reliability.record(
        request,
        key="signal-storm-continue-as-new",
        kind="fault",
        what=f"{2 * TURNS} hand-overs in waves from two concurrent senders ({TURNS} turns, "
        "each twice) while the user workflow continues-as-new (history capped at 50 events; "
        "dev server)",
        happened=f"continued-as-new {done.continued} times; de-duplication carried across runs; "
        f"{outcome.rounds} rounds, {outcome.fragments} fragments",
        outcome=outcome,
        started=started,
    )
