"""The pipeline on the dev server with a real redis-server, Milvus Lite and the offline models.

Two users, several rounds each, on the real worker: fragments counted in Milvus per user, the
profile built, the injected context readable from Redis and from the workflow query, and no
fragment of one user ever selected for the other.
"""

from __future__ import annotations

import time
import uuid

from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import memory_worker
from tests.support.replay import assert_replays

HOUR = 3600.0
ADA = [
    "Hello, my name is Ada and I work as a nurse in Leeds.",
    "Welcome Ada! What can I do for you today?",
    "My order number is 55120 and the parcel is late.",
    "Let me look up order 55120.",
    "I love gardening and I prefer text messages to calls.",
    "Got it, texts it is.",
    "My cat is called Pixel and she hates the delivery van.",
    "Pixel sounds like a character!",
]
BOB = [
    "Hi, I'm Bob, a carpenter from Bristol.",
    "Hello Bob, how can I help?",
    "I need to change the address for order 90017 to 12 Mill Lane.",
    "Updating the address for order 90017.",
    "I usually enjoy fishing on Sundays, so deliver on weekdays please.",
    "Weekday delivery noted.",
    "My favourite food is mushroom risotto, by the way.",
    "Sounds delicious.",
]


async def test_two_users_several_rounds_each(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    client = dev_env.client
    async with memory_worker(
        client,
        milvus_uri=milvus_uri,
        redis_url=redis_url,
        models=HeuristicMemoryModels(),
        embeddings=UniversalSentenceEncoderEmbeddings(),
    ) as mw:
        tag = uuid.uuid4().hex[:6]
        users = {f"ada-{tag}": ADA, f'bob {tag} / ünïcode "quoted"': BOB}
        # Stamped hours ago: production gates apply and every round is due at once.
        t0 = time.time() - 3 * HOUR
        handles = {}
        for user, lines in users.items():
            turns = conversation("thread-1", lines, t0)
            for half in (turns[:4], turns[4:]):
                handles[user] = await submit(client, mw.task_queue, user, half)
                await wait_status(
                    handles[user],
                    lambda s, end=half[-1].position + 1: s.watermarks["thread-1"].indexed >= end,
                    deadline_s=90,
                    what=f"round for {user}",
                )
        for user, handle in handles.items():
            status = await wait_status(
                handle,
                lambda s: s.inductions >= 1 and s.uninducted == 0,
                deadline_s=90,
                what="induction",
            )
            assert status.rounds_completed >= 1 and status.rounds_failed == 0
            stored = await mw.store.all_for_user(user)
            assert len(stored) == sum(r.fragments for r in status.rounds) > 0
            assert {f.user_id for f in stored} == {user}

            from_redis = await mw.read_model.get(user)
            from_query = await handle.query(UserMemoryWorkflow.context)
            assert from_redis is not None and from_redis.fragments
            assert from_redis.version == from_query.version
            assert [f.id for f in from_redis.fragments] == [f.id for f in from_query.fragments]
            own_ids = {f.id for f in stored}
            assert {f.id for f in from_redis.fragments} <= own_ids, "another user's fragment"
            assert from_redis.profile.name, "profile not built"

        ada, bob = list(users)
        assert "Ada" in (await mw.read_model.get(ada)).profile.name
        assert "Bob" in (await mw.read_model.get(bob)).profile.name
        ada_text = " ".join(f.content for f in (await mw.read_model.get(ada)).fragments)
        bob_text = " ".join(f.content for f in (await mw.read_model.get(bob)).fragments)
        assert "90017" not in ada_text and "55120" not in bob_text

        for user, handle in handles.items():
            status = await handle.query(UserMemoryWorkflow.status)
            ids = [user_workflow_id(user), *(r.workflow_id for r in status.rounds)]
            assert await assert_replays(client, ids, name=f"pipeline-{user[:3]}") == len(ids)
