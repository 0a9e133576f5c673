"""Forgets racing rounds, with what an integrator combines: summarisation in the same agent and
two worker processes on one task queue (docs/ARCHITECTURE.md, "Forget").

While an agent keeps talking, fragments are forgotten one by one as rounds run in either worker
process; then a fragment's forget and the whole user's forget are sent together (the user's
saga waits for that fragment's republish). Every line said is distinct and counted: what was
not forgotten is stored exactly once, nothing forgotten is in Milvus, in any Redis key of the
user, or in the workflow's own answer, and after the whole forget only what is said later is
remembered.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from mnemoflow.models.fragments import Fragment
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.middleware.test_delivery import HOUR, Writer, line, settled, summarizer
from tests.support.drive import eventually
from tests.support.process_stack import process_stack
from tests.support.worker_process import worker_process

pytestmark = pytest.mark.integration

TURNS = 36
FORGET_EVERY = 6


async def _redis_texts(redis: aioredis.Redis, prefix: str) -> str:
    """Every value under the test's key prefix, as text (strings and hashes)."""
    out: list[str] = []
    async for key in redis.scan_iter(match=f"{prefix}*"):
        kind = await redis.type(key)
        if kind == b"string":
            out.append((await redis.get(key) or b"").decode("utf-8", "replace"))
        elif kind == b"hash":
            for field, value in (await redis.hgetall(key)).items():
                out.append(field.decode("utf-8", "replace"))
                out.append(value.decode("utf-8", "replace"))
    return "\n".join(out)


async def test_forgets_racing_rounds_with_summarisation_and_two_worker_processes(
    milvus_uri: str, redis_url: str, tmp_path: Path
) -> None:
    rng = random.Random(20261202)
    async with process_stack(tmp_path, milvus_uri, redis_url, "fr") as stack:
        temporal, store, client, redis = stack.temporal, stack.store, stack.clients[0], stack.redis
        user, prefix, common = f"fr-{stack.tag}", stack.prefix, stack.worker_args
        writer = Writer(client, [summarizer()], True, time.time() - 3 * HOUR)
        said: list[str] = []
        forgotten: dict[str, str] = {}  # fragment id -> its content
        pending: list[asyncio.Task[object]] = []
        spans: list[tuple[float, float]] = []  # each forget, from its call to its answer

        async def forget_one() -> None:
            """Forget a random stored fragment not forgotten yet, while rounds go on."""
            rows: list[Fragment] = []

            async def stored() -> bool:
                rows[:] = [f for f in await store.all_for_user(user) if f.id not in forgotten]
                return bool(rows)

            await eventually(stored, deadline_s=60, what="a fragment to forget")
            victim = rng.choice(rows)
            forgotten[victim.id] = victim.content
            began = time.time()
            result = await client.forget_fragment(user, victim.id, timeout_s=60)
            assert result.deleted == 1, (victim.id, result)
            spans.append((began, time.time()))

        # One worker's store writes take 0.4 s: rounds there are still running as forgets come.
        with (
            worker_process(tmp_path, "one", slow_index_s=0.4, **common),  # type: ignore[arg-type]
            worker_process(tmp_path, "two", **common),  # type: ignore[arg-type]
        ):
            for i in range(TURNS):
                text = line(rng, i, "fr")
                said += [text, await writer.say(user, "a", text)]
                if i % FORGET_EVERY == FORGET_EVERY - 1:
                    await client.consolidate(user, "a")  # a round runs as the forget does
                    pending.append(asyncio.create_task(forget_one()))
            await asyncio.gather(*pending)
            await writer.memory.flush(timeout_s=60)
            status = await settled(client, user, ["a"])
            assert status.rounds_failed == 0, status.last_error
            assert len(forgotten) >= TURNS // FORGET_EVERY - 1, "too few forgets to test"
            rounds = [(r.started_at, r.finished_at or r.started_at) for r in status.rounds]
            raced = sum(1 for a, b in spans if any(a < end and start < b for start, end in rounds))
            assert raced >= 1, (spans, rounds)

            # What was not forgotten is stored once; nothing forgotten is anywhere.
            gone = [s for s in said if any(s in content for content in forgotten.values())]
            kept = [s for s in said if s not in gone]
            assert gone, "no forgotten line: nothing tested"
            rows = await store.all_for_user(user)
            texts = [f.content for f in rows]
            assert not {f.id for f in rows} & set(forgotten)
            for s in kept:
                assert sum(t.count(s) for t in texts) == 1, s
            for s in gone:
                assert not any(s in t for t in texts), s

            async def published_clean() -> bool:
                in_redis = await _redis_texts(redis, prefix)
                return not any(s in in_redis for s in gone) and not any(
                    fid in in_redis for fid in forgotten
                )

            await eventually(published_clean, deadline_s=30, what="forgotten lines leave Redis")
            own = await temporal.get_workflow_handle(client.workflow_id(user)).query(
                UserMemoryWorkflow.context
            )
            assert own.fragments, "nothing published: nothing tested"
            assert not {f.id for f in own.fragments} & set(forgotten)
            assert not any(s in f.content for f in own.fragments for s in gone)
            injected = await client.context(user)
            assert injected is not None and injected.fragments
            assert not any(s in f.content for f in injected.fragments for s in gone)

            # A fragment's forget and the whole user's forget together.
            last = rng.choice(await store.all_for_user(user))
            one = asyncio.create_task(client.forget_fragment(user, last.id, timeout_s=60))
            receipt = await client.forget(user, reason="test")
            await one
            assert receipt.fragments_deleted >= 1
            assert await store.all_for_user(user) == []
            left = await _redis_texts(redis, prefix)
            assert not any(s in left for s in said)

            # Only what is said after the forget is remembered.
            # The writer's clock is left behind the worker's: what it says after the forget is
            # kept by its forget epoch, not by its time (docs/ARCHITECTURE.md, "Forget epochs").
            assert writer.clock < receipt.at
            after: list[str] = []
            for i in range(6):
                text = line(rng, 100 + i, "after")
                after += [text, await writer.say(user, "b", text)]
            await writer.memory.flush(timeout_s=60)
            await settled(client, user, ["b"])
            texts = [f.content for f in await store.all_for_user(user)]
            for s in after:
                assert sum(t.count(s) for t in texts) == 1, s
            for s in said:
                assert not any(s in t for t in texts), s
            await temporal.get_workflow_handle(client.workflow_id(user)).terminate("test over")
