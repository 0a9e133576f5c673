"""The per-call memory search on the dev server with the real worker, Redis and Milvus Lite.

A detail stated in session 1 of ten sessions reaches a model call in a new thread for a question
that names it in other words (the USE embeddings of the worker and of the agent process); when
the search cannot answer (the Redis it reads the corpus version from stops answering), the call
goes on with the published context within the search deadline.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.middleware.milvus_search import MilvusSearch
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.turns import ChatTurn
from tests.middleware.test_agent_integration import ScriptedModel
from tests.support.drive import eventually
from tests.support.memory_worker import memory_worker

pytestmark = pytest.mark.integration

CORE = "You are a friendly companion."
DETAIL = "My daughter Lily has just started taking violin lessons on Saturdays."
TOPICS = [
    "the weather at the coast",
    "a new recipe for lentil soup",
    "the football match last night",
    "repainting the kitchen walls",
    "a podcast about ancient Rome",
    "the train strike in the city",
    "planting tomatoes in the garden",
    "a film about deep sea divers",
    "a long hike in the mountains",
]
DAY = 86400.0


@dataclass
class Ctx:
    user_id: str


def _session(n: int, t0: float) -> list[ChatTurn]:
    if n == 0:
        lines = ["Hi! Long week.", DETAIL, "Anyway, how are you?", "All good here, thanks."]
    else:
        topic = TOPICS[n - 1]
        lines = [
            f"Today I mostly thought about {topic}.",
            f"Oh nice, tell me more about {topic}.",
            f"There is not much more to say about {topic}, honestly.",
            "Fair enough, talk soon.",
        ]
    return [
        ChatTurn(
            thread_id=f"session-{n}",
            position=i,
            role="human" if i % 2 == 0 else "ai",
            content=line,
            time=t0 + n * DAY + 30 * i,
        )
        for i, line in enumerate(lines)
    ]


@pytest.fixture(scope="module")
def use() -> UniversalSentenceEncoderEmbeddings:
    embeddings = UniversalSentenceEncoderEmbeddings()
    embeddings.embed_query("load the model once for the module")
    return embeddings


@asynccontextmanager
async def ten_sessions(
    env: WorkflowEnvironment, milvus_uri: str, redis_url: str, use: Any
) -> AsyncIterator[tuple[MemoryClient, str, float]]:
    """A worker, a client searching with USE, and a user with ten settled sessions."""
    config = MemoryConfig(search_deadline_s=0.5)
    async with memory_worker(
        env.client,
        milvus_uri=milvus_uri,
        redis_url=redis_url,
        models=HeuristicMemoryModels(),
        embeddings=use,
    ) as mw:
        client = mw.memory_client(redis_url, config=config, embeddings=use)
        user = f"search-{uuid.uuid4().hex[:8]}"
        mw.track(client.workflow_id(user))
        t0 = time.time() - 30 * DAY
        try:
            for n in range(10):
                await client.submit(user, _session(n, t0))

            async def settled() -> bool:
                status = await client.status(user)
                if status is None or status.uninducted or status.pending_turns:
                    return False
                marks = [status.watermarks.get(f"session-{n}") for n in range(10)]
                return all(m is not None and m.indexed >= 4 for m in marks)

            await eventually(settled, deadline_s=120.0, what="ten sessions indexed")
            yield client, user, t0 + 11 * DAY
        finally:
            await client.aclose()


async def _ask(client: MemoryClient, now: float, user: str, question: str) -> tuple[str, float]:
    model = ScriptedModel()
    memory = DurableMemoryMiddleware(client=client, core_prompt=CORE, clock=lambda: now)
    agent = create_agent(
        model, [], middleware=[memory], context_schema=Ctx, checkpointer=InMemorySaver()
    )
    started = time.monotonic()
    await agent.ainvoke(
        {"messages": [HumanMessage(content=question)]},
        config={"configurable": {"thread_id": f"q-{uuid.uuid4().hex[:6]}"}},
        context=Ctx(user_id=user),
    )
    elapsed = time.monotonic() - started
    await memory.flush()
    system = [m for m in model.seen[0] if m.type == "system"]
    return (system[0].text if system else ""), elapsed


async def test_a_detail_of_session_one_reaches_a_new_thread_in_other_words(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str, use: Any
) -> None:
    async with ten_sessions(dev_env, milvus_uri, redis_url, use) as (client, user, now):
        published = await client.context(user)
        assert published is not None
        prompt, _ = await _ask(client, now, user, "Which musical instrument is my kid learning?")
        assert DETAIL in prompt
        assert "## Relevant memories" in prompt
        # The fragment says when it was said (session 1, thirty days before the question).
        assert time.strftime("%Y", time.gmtime(now - 11 * DAY)) in prompt


async def test_a_search_that_hangs_falls_back_to_the_published_context_in_time(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str, use: Any
) -> None:
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accept and never answer: a Redis that hangs

    blackhole = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = blackhole.sockets[0].getsockname()[1]
    hung = aioredis.Redis(host="127.0.0.1", port=port, socket_timeout=60, retry=None)
    try:
        async with ten_sessions(dev_env, milvus_uri, redis_url, use) as (client, user, now):
            published = await client.context(user)
            assert published is not None and published.fragments
            assert isinstance(client.searcher, MilvusSearch)
            client.searcher = MilvusSearch(
                client.searcher.uri,
                collection=client.searcher.collection,
                embeddings=use,
                redis=hung,
                key_prefix=client.key_prefix,
                timeout_s=60.0,
            )
            prompt, elapsed = await _ask(client, now, user, "Which instrument is my kid learning?")
            # The published context was injected, and the call did not wait for the search
            # (whose own timeout is a minute) beyond its 0.5 s deadline and the turn's work.
            assert "## Relevant memories" in prompt
            shown = [f for f in published.fragments if f.content.splitlines()[0] in prompt]
            assert shown
            assert elapsed < 10.0
    finally:
        for writer in held:
            writer.close()
        blackhole.close()
        await hung.aclose()
