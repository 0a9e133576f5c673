"""A busy user's workflow still continues as new at its history bound (workflows/user_memory.py).

The bound used to be checked only when the loop had nothing to do, so a user with a round always
due (a steady conversation, or a backlog) grew its history far past it (~8,700 events measured),
and a worker without it in cache replayed all of that before answering a query. Here a backlog
of rounds is always due; every run of the user workflow must stay near the bound.
"""

from __future__ import annotations

import time
import uuid

from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import UserStatus
from mnemoflow.models.ids import user_workflow_id
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import memory_worker

CAP = 60
#: One round's events in the user workflow and the absorbing of the events around it.
SLACK = 30
LINES = [
    "Hi, my name is Ada Lovelace and I work as a data engineer.",
    "Nice to meet you Ada, how can I help?",
    "My order number is 7734-221 and it has not arrived yet.",
    "I am checking order 7734-221 for you now.",
    "I prefer email over phone calls, and I am busy on Wednesdays.",
    "Noted: email, and not on Wednesdays.",
]


async def test_busy_user_continues_as_new_at_the_bound(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"busy-{uuid.uuid4().hex[:8]}"
        turns = conversation("t", LINES * 4, time.time() - 4 * 3600)
        # Two messages per round: the whole backlog takes 12 rounds, one always due.
        config = MemoryConfig.from_vocation("customer service").model_copy(
            update={"max_turns_per_round": 2}
        )
        handle = None
        for i in range(0, len(turns), 2):
            handle = await submit(
                client,
                mw.task_queue,
                user,
                turns[i : i + 2],
                urgent=True,
                config=config,
                max_history_events=CAP,
            )
        assert handle is not None

        def all_indexed(s: UserStatus) -> bool:
            mark = s.watermarks.get("t")
            return mark is not None and mark.indexed == len(turns)

        done = await wait_status(handle, all_indexed, deadline_s=120, what="backlog indexed")
        assert done.continued >= 1
        lengths = []
        async for execution in client.list_workflows(f"WorkflowId = '{user_workflow_id(user)}'"):
            history = await client.get_workflow_handle(
                execution.id, run_id=execution.run_id
            ).fetch_history()
            lengths.append(len(history.events))
        assert len(lengths) >= 2, lengths
        assert max(lengths) <= CAP + SLACK, lengths
