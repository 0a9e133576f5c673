"""A round takes at most ROUND_MAX_BYTES of turns (workflows/user_rounds.py), on the dev server.

`max_turns_per_round` (64) alone did not bound a round's bytes: with a model of a large window
(`max_input_tokens` a million) and longer parts (`max_turn_chars` 10,000), 64 turns of emoji text
made a round whose payloads passed Temporal's 2 MB; its workflow task failed at every attempt,
queries with it, and nothing was indexed (this test timed out with no status before).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.base import SlicedDrafts
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.turns import ChatTurn
from tests.support.drive import submit, wait_status
from tests.support.memory_worker import memory_worker

MARK = re.compile(r"R\d\dS\d\d")


class OneDraftATurn(HeuristicMemoryModels):
    """A quick slicer (the offline one takes seconds on 2 MB): one verbatim draft a turn."""

    async def slice(self, turns: list[ChatTurn], max_fragments: int) -> SlicedDrafts:
        drafts: list[dict[str, Any]] = [
            {"theme": "t", "types": ["fact"], "content": t.content, "start_idx": i, "end_idx": i}
            for i, t in enumerate(turns)
        ]
        return SlicedDrafts(drafts=drafts[:max_fragments])


def wide_turns(count: int, t0: float) -> list[ChatTurn]:
    """`count` turns of 78 marked sentences of emoji (~38 KB each in JSON)."""
    return [
        ChatTurn(
            thread_id="t",
            position=k,
            role="human",
            content=" ".join(f"R{k:02d}S{j:02d}" + "😀" * 120 + "." for j in range(78)),
            time=t0 + k,
        )
        for k in range(count)
    ]


async def test_sixty_six_wide_turns_go_in_rounds_under_the_payload_limit(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=OneDraftATurn()
    ) as mw:
        user = f"wide-{uuid.uuid4().hex[:6]}"
        # not mature: nothing is sliced before the last event asks for it
        turns = wide_turns(66, time.time())
        assert sum(len(t.model_dump_json().encode()) for t in turns[:64]) > 2 * 1024 * 1024
        config = MemoryConfig(max_input_tokens=1_000_000, max_turn_chars=10_000)
        for i in range(0, 66, 11):
            handle = await submit(
                mw.client, mw.task_queue, user, turns[i : i + 11], config=config,
                event_id=f"wide-{i}", urgent=i == 55,
            )  # fmt: skip
        done = await wait_status(
            handle, lambda s: s.pending_turns == 0, deadline_s=90, what="every turn indexed"
        )
        assert done.rounds_failed == 0 and done.rounds_completed >= 5
        assert done.watermarks["t"].indexed == len(turns)
        said = [m for t in turns for m in MARK.findall(t.content)]
        stored = [m for f in await mw.store.all_for_user(user) for m in MARK.findall(f.content)]
        assert sorted(stored) == sorted(said)  # each sentence once
