"""Whole rounds through the real DeepSeek client against the emulated endpoint (time-skipping).

A round whose slicer keeps answering outside the schema is retried, then fails visibly with the
non-retryable type MalformedModelOutput; its messages stay pending, un-indexed.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.langchain_models import LangChainMemoryModels
from tests.support.deepseek_emulator import DeepSeekEmulator, Reply
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import memory_worker

LINES = ["I'm Gus and my order 4411 is late.", "Checking order 4411.", "Thanks."]
SLICE = {
    "fragments": [
        {
            "theme": "orders",
            "types": ["identity", "fact"],
            "content": "Gus, order 4411 late",
            "start_idx": 0,
            "end_idx": 2,
        },
    ]
}
TUNE = {"alpha": 2.0, "beta": 1.0, "gamma": 1.0, "delta": 0.5, "w0": 0.2, "w1": 0.2, "w2": 0.2}


def models(emu: DeepSeekEmulator) -> LangChainMemoryModels:
    chat = emu.chat_model()
    return LangChainMemoryModels(chat)


async def test_round_through_deepseek_parses_and_renormalises(
    time_skipping_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    emulator: DeepSeekEmulator,
) -> None:
    env = time_skipping_env
    emulator.push(Reply.tool(SLICE), Reply.tool(TUNE))
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models(emulator)
    ) as mw:
        user = f"gus-{uuid.uuid4().hex[:6]}"
        t0 = (await env.get_current_time()).timestamp()
        handle = await submit(
            env.client, mw.task_queue, user, conversation("t", LINES, t0), urgent=True
        )
        done = await wait_status(handle, lambda s: s.rounds_completed == 1, env=env, step_s=1)
        [fragment] = await mw.store.all_for_user(user)
        # the model's paraphrase, and the turns it did not quote, verbatim
        assert fragment.content == (
            "Gus, order 4411 late\nUser: I'm Gus and my order 4411 is late.\n"
            "Assistant: Checking order 4411.\nUser: Thanks."
        )
        assert done.ledger.by_operation["slice"].calls == 1
        assert done.ledger.by_operation["slice"].cache_miss_tokens > 0
        assert done.tuned_themes == ["orders"]
        params = done.tuned["orders"]
        assert params.alpha + params.beta + params.gamma == pytest.approx(1.0)
        assert params.w0 + params.w1 + params.w2 == pytest.approx(1.0)
        assert params.alpha == pytest.approx(0.5) and params.delta == pytest.approx(0.2)
        assert len(emulator.requests) == 2  # one slice call, one tune call: no client retries


async def test_malformed_replies_are_retried_then_the_messages_kept_verbatim(
    time_skipping_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    emulator: DeepSeekEmulator,
) -> None:
    """A model that never makes its slice valid is given up after its attempts; its turns are
    kept verbatim, so the thread is not blocked behind them (docs/ARCHITECTURE.md, "The round")."""
    env = time_skipping_env
    malformed = Reply.tool_text('{"fragments": [ {"theme": ')
    emulator.push(malformed, malformed, malformed, Reply.tool(TUNE))
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models(emulator)
    ) as mw:
        user = f"gus-{uuid.uuid4().hex[:6]}"
        t0 = (await env.get_current_time()).timestamp()
        handle = await submit(
            env.client, mw.task_queue, user, conversation("t", LINES, t0), urgent=True
        )
        done = await wait_status(handle, lambda s: s.rounds_completed == 1, env=env, step_s=5)
        assert len(emulator.requests) == 4  # the slice tried 3 times, then given up; the tune
        assert done.rounds_failed == 0 and done.pending_turns == 0
        assert done.watermarks["t"].indexed == len(LINES)
        stored = [f.content for f in await mw.store.all_for_user(user)]
        assert [sum(text.count(line) for text in stored) for line in LINES] == [1, 1, 1]
