"""A forced continue-as-new keeps everything: queue, de-duplication, watermarks, cursor, tuned
cache and profile (dev server: the time-skipping server's continue-as-new is not atomic, so a
signal-with-start racing it is not a fair test there)."""

from __future__ import annotations

import time
import uuid

from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.turns import ChatTurn
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, status, submit, wait_status
from tests.support.memory_worker import memory_worker

LINES = [
    "Hi, my name is Ada Lovelace and I work as a data engineer.",
    "Nice to meet you Ada, how can I help?",
    "My order number is 7734-221 and it has not arrived yet.",
    "I am checking order 7734-221 for you now.",
    "I prefer email over phone calls, and I am busy on Wednesdays.",
    "Noted: email, and not on Wednesdays.",
]
CAP = 50


async def test_forced_continue_as_new_keeps_all_state(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"can-{uuid.uuid4().hex[:8]}"
        turns = conversation("t", LINES * 3, time.time() - 4 * 3600)
        handle = None
        for i in range(0, len(turns), 2):
            handle = await submit(
                client, mw.task_queue, user, turns[i : i + 2], max_history_events=CAP
            )
            await wait_status(handle, lambda s: s.pending_events == 0)
        assert handle is not None
        done = await wait_status(
            handle,
            lambda s: s.continued >= 1 and s.pending_turns == 0 and s.inductions >= 1,
            what="continue-as-new after rounds",
        )
        assert done.watermarks["t"].accepted == done.watermarks["t"].indexed == len(turns)
        assert done.tuned_themes, "the tuned-parameter cache was lost"
        assert (await handle.query(UserMemoryWorkflow.profile)).name

        # Events seen before continue-as-new are still recognised afterwards.
        before = await status(handle)
        await submit(client, mw.task_queue, user, turns[:2], max_history_events=CAP)
        after = await wait_status(handle, lambda s: s.pending_events == 0)
        assert after.pending_turns == 0 and after.rounds_started == before.rounds_started
        assert after.induction_cursor >= before.induction_cursor
        assert await mw.store.count(user) == sum(r.fragments for r in after.rounds)

        # A queue of not-yet-mature turns survives continue-as-new and is sliced exactly once.
        # More signals than the history cap, however the server batches them into tasks.
        fresh = conversation(
            "fresh", [f"fresh detail number {i}" for i in range(CAP + 10)], time.time()
        )
        for turn in fresh:
            await submit(client, mw.task_queue, user, [turn], max_history_events=CAP)
        queued = await wait_status(
            handle,
            lambda s: s.continued > after.continued and s.pending_events == 0,
            what="continue-as-new with a queue",
        )
        assert queued.pending_turns == len(fresh)
        assert queued.watermarks["fresh"].accepted == len(fresh)
        assert queued.watermarks["fresh"].indexed == 0
        assert queued.induction_cursor >= after.induction_cursor
        assert queued.tuned_themes == after.tuned_themes

        # The window hit its ceiling: the queued turns are sliced now, once.
        last: ChatTurn = fresh[-1]
        await submit(
            client,
            mw.task_queue,
            user,
            [last],
            event_id="ceiling",
            urgent=True,
            max_history_events=CAP,
        )
        sliced = await wait_status(
            handle, lambda s: s.watermarks["fresh"].indexed == len(fresh), what="queue sliced"
        )
        assert sliced.pending_turns == 0 and sliced.rounds_failed == 0
        fragments = await mw.store.all_for_user(user)
        assert len({f.id for f in fragments}) == len(fragments)
        assert len(fragments) == sum(r.fragments for r in sliced.rounds)
        assert (await handle.query(UserMemoryWorkflow.profile)).name
