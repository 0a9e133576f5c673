"""An induction batch the model refuses for good shrinks, on the dev server.

A provider answers HTTP 400 ("maximum context length exceeded") to a prompt too long for its
window: a non-retryable error. The same batch was sent again at every back-off, so no later fact
ever reached the profile. Now the batch halves until it fits, and a single fragment that is
still refused is left out, counted in `last_error`, so the facts after it reach the profile.
"""

from __future__ import annotations

import json
import time
import uuid

from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.base import InductedProfile
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.models.profile import UserProfile
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import memory_worker
from tests.support.replay import assert_replays

WINDOW = 2  # fragments the model's window holds
REFUSED = "4471"  # a fragment refused whatever its batch (a content filter answers 400 too)

FACTS = [
    ("name", "My name is Odile Brandt.", "Odile Brandt"),
    ("order", "My order number is 7734.", "7734"),
    ("hobby", "I love hiking.", "hiking"),
    ("locker", "My locker code is 4471.", "4471"),
    ("goal", "I want to learn Welsh.", "learn Welsh"),
    ("diet", "I am vegan.", "vegan"),
]


class ContextLengthExceeded(Exception):
    status_code = 400  # what an openai-style client raises for "maximum context length"


class WindowedInduct(HeuristicMemoryModels):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    async def induct(self, profile: UserProfile, fragments: list[Fragment]) -> InductedProfile:
        self.batches.append(len(fragments))
        if len(fragments) > WINDOW or any(REFUSED in f.content for f in fragments):
            raise ContextLengthExceeded("This model's maximum context length is exceeded")
        return await super().induct(profile, fragments)


async def test_a_refused_batch_shrinks_and_a_fragment_refused_alone_is_skipped(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    models = WindowedInduct()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = f"odile-{uuid.uuid4().hex[:6]}"
        t0 = time.time() - 4 * 86_400
        turns = []
        for k, (thread, line, _) in enumerate(FACTS):
            turns += conversation(thread, [line, "Noted."], t0 + k * 600)
        config = MemoryConfig.from_vocation("customer service").model_copy(
            update={"failed_round_backoff_s": 1.0}
        )
        handle = await submit(mw.client, mw.task_queue, user, turns, urgent=True, config=config)
        st = await wait_status(
            handle,
            lambda s: s.rounds_completed == len(FACTS) and s.uninducted == 0,
            deadline_s=60,
            what="every fragment inducted or skipped",
        )
        profile = await handle.query("profile", result_type=UserProfile)
        blob = json.dumps(profile.model_dump(), ensure_ascii=False)
        said = {proof for _, _, proof in FACTS}
        assert {p for p in said if p in blob} == said - {REFUSED}  # all but the one refused alone
        assert st.last_error is not None and "(1 skipped in all)" in st.last_error
        assert models.batches[0] == len(FACTS) and max(models.batches[1:]) < len(FACTS)
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="induct-shrinks")
