"""ReadModel against a real redis-server: version monotonicity, keys, limits, activity errors."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from mnemoflow.activities.read_model import ReadModel, ReadModelActivities
from mnemoflow.devstack.processes import free_port
from mnemoflow.middleware.client import MemoryClient
from mnemoflow.models.contracts import ContextFragment, InjectedContext, PublishInput
from mnemoflow.models.errors import InvalidInputError, PayloadTooLargeError
from mnemoflow.models.ids import user_key
from mnemoflow.models.profile import UserProfile

pytestmark = pytest.mark.integration

CRAFTED = 'x" or user_key != "\\ 用户/😀'


def context(user: str, version: int, note: str = "") -> InjectedContext:
    """A small context whose fragment records the version it was built for."""
    fragment = ContextFragment(
        id=f"f{version}", theme="t", types=["fact"], content=note or str(version)
    )
    return InjectedContext(
        user_id=user, version=version, generated_at=float(version), fragments=[fragment]
    )


@pytest.fixture
async def read_model(redis_url: str, unique_name: str) -> AsyncIterator[ReadModel]:
    """A read model under a key prefix of its own."""
    rm = ReadModel(redis_url, f"{unique_name}:")
    try:
        yield rm
    finally:
        await rm.close()


async def test_publish_then_get_round_trips(read_model: ReadModel, redis_url: str) -> None:
    ctx = context(CRAFTED, 3, "busy on Wednesdays")
    out = await read_model.publish(ctx)
    assert out.key == f"{read_model.prefix}ctx:{user_key(CRAFTED)}"
    assert CRAFTED not in out.key
    assert out.bytes == len(ctx.model_dump_json().encode())
    assert await read_model.get(CRAFTED) == ctx
    assert await read_model.get("someone else") is None


async def test_an_older_version_never_overwrites_a_newer_one(read_model: ReadModel) -> None:
    await read_model.publish(context("alice", 5))
    await read_model.publish(context("alice", 4))
    got = await read_model.get("alice")
    assert got is not None and got.version == 5

    await read_model.publish(context("alice", 5, "same version again"))  # a retry may rewrite
    got = await read_model.get("alice")
    assert got is not None and got.fragments[0].content == "same version again"

    await read_model.publish(context("alice", 6))
    got = await read_model.get("alice")
    assert got is not None and got.version == 6


async def test_concurrent_publishes_end_on_the_highest_version(read_model: ReadModel) -> None:
    versions = list(range(1, 41))
    random.Random(7).shuffle(versions)
    await asyncio.gather(*(read_model.publish(context("bob", v)) for v in versions))
    got = await read_model.get("bob")
    assert got is not None and got.version == 40


async def test_delete(read_model: ReadModel) -> None:
    await read_model.publish(context("carol", 1))
    assert await read_model.delete("carol") == 1
    assert await read_model.delete("carol") == 0
    assert await read_model.get("carol") is None
    await read_model.publish(context("carol", 0))  # after a forget, version 0 is accepted again
    assert await read_model.get("carol") is not None


async def test_unreadable_value_counts_as_absent(read_model: ReadModel, redis_url: str) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    await raw.set(read_model.key("dave"), b"{not json")
    await raw.aclose()
    assert await read_model.get("dave") is None
    await read_model.publish(context("dave", 1))
    got = await read_model.get("dave")
    assert got is not None and got.version == 1


async def test_the_hot_path_reads_what_the_activity_publishes(
    read_model: ReadModel, redis_url: str
) -> None:
    """One key and one value format: MemoryClient.context (Temporal down, so Redis alone)
    returns exactly what ReadModel.publish wrote, for an id with quotes, CJK and emoji."""
    temporal = await Client.connect(
        f"127.0.0.1:{free_port()}", lazy=True, data_converter=pydantic_data_converter
    )
    client = MemoryClient(
        temporal=temporal,
        task_queue="nobody",
        redis=redis_url,
        key_prefix=read_model.prefix,
        query_timeout_s=0.5,
    )
    try:
        ctx = context(CRAFTED, 7, "prefers email")
        await read_model.publish(ctx)
        assert await client.context(CRAFTED) == ctx
        raw = aioredis.Redis.from_url(redis_url)
        await raw.set(read_model.key("gina"), b"{not json")
        await raw.aclose()
        # Unreadable is no clean miss: the client asks the (unreachable) workflow, gets None.
        assert await client.context("gina") is None
        assert await read_model.get("gina") is None
    finally:
        await client.aclose()


def ranked(user: str, version: int, *notes: str) -> InjectedContext:
    """A context whose fragments (best first) carry the given contents."""
    fragments = [
        ContextFragment(id=f"f{k}", theme="t", types=["fact"], content=note)
        for k, note in enumerate(notes)
    ]
    return InjectedContext(user_id=user, version=version, fragments=fragments)


async def test_payload_and_user_id_limits(redis_url: str, unique_name: str) -> None:
    small = ReadModel(redis_url, f"{unique_name}:", max_bytes=700)
    try:
        # Fragments past the bound: the lowest ranked go, the rest is published.
        out = await small.publish(ranked("erin", 1, "first fact", "second fact", "x" * 1000))
        stored = await small.get("erin")
        assert stored is not None and [f.content for f in stored.fragments] == [
            "first fact",
            "second fact",
        ]
        assert out.bytes == len(stored.model_dump_json().encode()) <= 700
        # Too big without any fragment (the profile alone): refused, the old copy stays.
        huge = ranked("erin", 2).model_copy(update={"profile": UserProfile(name="y" * 1000)})
        with pytest.raises(PayloadTooLargeError, match="without any fragment"):
            await small.publish(huge)
        stored = await small.get("erin")
        assert stored is not None and stored.version == 1
        with pytest.raises(InvalidInputError):
            await small.get("")
    finally:
        await small.close()


async def test_publish_activity_maps_permanent_errors(redis_url: str, unique_name: str) -> None:
    rm = ReadModel(redis_url, f"{unique_name}:", max_bytes=500)
    acts = ReadModelActivities(rm)
    env = ActivityEnvironment()
    try:
        out = await env.run(acts.publish, PublishInput(context=context("frank", 2)))
        assert out.key == rm.key("frank")

        huge = context("frank", 3).model_copy(update={"profile": UserProfile(name="y" * 1000)})
        with pytest.raises(ApplicationError) as too_big:
            await env.run(acts.publish, PublishInput(context=huge))
        assert too_big.value.type == "PayloadTooLarge" and too_big.value.non_retryable

        with pytest.raises(ApplicationError) as invalid:
            await env.run(acts.publish, PublishInput(context=context("a\x00b", 1)))
        assert invalid.value.type == "InvalidInput" and invalid.value.non_retryable
    finally:
        await rm.close()


async def test_unreachable_redis_fails_fast_without_client_retries() -> None:
    rm = ReadModel(f"redis://127.0.0.1:{free_port()}/0", timeout_s=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(aioredis.ConnectionError):
            await rm.get("alice")
    finally:
        await rm.close()
    assert time.monotonic() - started < 1.0
