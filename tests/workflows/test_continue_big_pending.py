"""A user workflow continues as new only when its next input fits (workflows/user_memory.py).

Long messages said while the memory model was down waited in the state; at the history bound
the workflow continued as new with all of them in its input, past Temporal's 2 MB payload
limit: that workflow task failed at every attempt and the user's memory stopped (this test
timed out before). Now it waits for its rounds, which take the turns 512 KB at a time.
"""

from __future__ import annotations

import time
import uuid

from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.config import MemoryConfig
from tests.support.drive import submit, wait_status
from tests.support.memory_worker import memory_worker
from tests.support.operations import Forbidden
from tests.workflows.test_round_bytes import MARK, OneDraftATurn, wide_turns


class DownThenUp(OneDraftATurn):
    """Rejects every slice while `down` (the round fails and backs off), then slices."""

    down = True

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        if self.down:
            raise Forbidden("memory model down (test)")
        return await super().slice(turns, max_fragments)


async def test_big_pending_turns_wait_for_their_rounds_before_continue_as_new(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    models = DownThenUp()
    assert isinstance(models, HeuristicMemoryModels)
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = f"waits-{uuid.uuid4().hex[:6]}"
        turns = wide_turns(60, time.time() - 3 * 3600)
        config = MemoryConfig(
            max_input_tokens=1_000_000, max_turn_chars=10_000, failed_round_backoff_s=1.0
        )
        for i in range(0, 60, 10):  # 2.3 MB of turns, each event under the signal bound
            handle = await submit(
                mw.client, mw.task_queue, user, turns[i : i + 10], config=config,
                event_id=f"wide-{i}", max_history_events=50,
            )  # fmt: skip
        failing = await wait_status(
            handle,
            lambda s: s.rounds_failed >= 3 and s.history_length >= 50,
            deadline_s=90,
            what="rounds failing past the history bound",
        )
        assert failing.watermarks["t"].accepted == len(turns)
        models.down = False
        done = await wait_status(
            handle, lambda s: s.pending_turns == 0, deadline_s=90, what="every turn indexed"
        )
        assert done.watermarks["t"].indexed == len(turns)
        said = [m for t in turns for m in MARK.findall(t.content)]
        stored = [m for f in await mw.store.all_for_user(user) for m in MARK.findall(f.content)]
        assert sorted(stored) == sorted(said)
        later = await wait_status(
            handle, lambda s: s.continued >= 1, deadline_s=60, what="continued once drained"
        )
        assert later.pending_turns == 0
