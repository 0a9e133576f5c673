"""The per-call search served by Milvus on the dev server, with the real worker (its store
writing every fragment's lines), Redis and Milvus Lite (README.md, "How memory
is chosen for a call").

A detail stated in session 1 of ten sessions reaches a model call in a new thread for a question
in other words, and once forgotten never does; the agent process holds no user's corpus and
Redis holds no corpus copy; with Milvus hanging, the call injects the published context in time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.middleware.milvus_search import MilvusSearch
from mnemoflow.models.corpus import corpus_key, corpus_version_key
from mnemoflow.models.ids import context_key
from tests.middleware.test_memory_search import DETAIL, _ask, ten_sessions, use

pytestmark = pytest.mark.integration

__all__ = ["use"]  # the module fixture, shared

QUESTION = "Which musical instrument is my kid learning?"


async def test_session_one_s_detail_reaches_a_new_thread_and_once_forgotten_never(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str, use: Any
) -> None:
    async with ten_sessions(dev_env, milvus_uri, redis_url, use) as (
        client,
        user,
        now,
    ):
        assert isinstance(client.searcher, MilvusSearch)
        found = await client.search(user, QUESTION, now)
        assert found is not None
        prompt, _ = await _ask(client, now, user, QUESTION)
        assert DETAIL in prompt
        assert "## Relevant memories" in prompt
        # nothing of the user's corpus is held in the agent process
        assert not [v for v in vars(client.searcher).values() if isinstance(v, dict) and v]

        # No corpus copy in Redis: the read model (published context, watermarks, profile)
        # and the corpus version only.
        redis = client.reader.redis
        assert redis is not None
        keys = {k.decode() async for k in redis.scan_iter(match=f"{client.key_prefix}*")}
        assert corpus_key(client.key_prefix, user) not in keys
        assert not [k for k in keys if k.startswith(f"{client.key_prefix}corpus:")]
        assert corpus_version_key(client.key_prefix, user) in keys
        holding = [k for k in keys if await redis.type(k) == b"string"]
        holding = [k for k in holding if DETAIL.encode() in (await redis.get(k) or b"")]
        assert set(holding) <= {context_key(client.key_prefix, user)}
        for key in keys:
            if await redis.type(key) == b"hash":
                values = await redis.hvals(key)  # type: ignore[misc]
                assert not [v for v in values if DETAIL.encode() in v], key

        # Forget the fragment holding the detail: no later call injects it.
        holders = [f.id for f in found if DETAIL in f.content]
        assert holders
        for fid in holders:
            result = await client.forget_fragment(user, fid)
            assert result.deleted == 1
        prompt, _ = await _ask(client, now, user, QUESTION)
        assert DETAIL not in prompt
        prompt, _ = await _ask(client, now, user, "violin lessons on Saturdays for Lily?")
        assert "violin" not in prompt


async def test_a_milvus_that_hangs_leaves_the_published_context_in_time(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str, use: Any
) -> None:
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accept and never answer: a Milvus that hangs

    blackhole = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = blackhole.sockets[0].getsockname()[1]
    try:
        async with ten_sessions(dev_env, milvus_uri, redis_url, use) as (
            client,
            user,
            now,
        ):
            published = await client.context(user)
            assert published is not None and published.fragments
            hung = MilvusSearch(
                f"http://127.0.0.1:{port}",
                collection="unused",
                embeddings=use,
                redis=client.reader.redis,
                key_prefix=client.key_prefix,
                timeout_s=30.0,
            )
            client.searcher = hung
            started = time.monotonic()
            prompt, elapsed = await _ask(client, now, user, "Which instrument is my kid learning?")
            # The published context was injected, without waiting for the search (whose own
            # deadline is 30 s) beyond the 0.5 s search deadline and the turn's own work.
            assert "## Relevant memories" in prompt
            shown = [f for f in published.fragments if f.content.splitlines()[0] in prompt]
            assert shown
            assert elapsed < 10.0
            assert time.monotonic() - started < 10.0
    finally:
        for writer in held:
            writer.close()
        blackhole.close()
