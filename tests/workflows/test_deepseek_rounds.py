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


async def test_malformed_replies_fail_the_round_visibly_and_keep_its_messages(
    time_skipping_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    emulator: DeepSeekEmulator,
) -> None:
    env = time_skipping_env
    emulator.push(*[Reply.tool_text('{"fragments": [ {"theme": ') for _ in range(3)])
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models(emulator)
    ) as mw:
        user = f"gus-{uuid.uuid4().hex[:6]}"
        t0 = (await env.get_current_time()).timestamp()
        handle = await submit(
            env.client, mw.task_queue, user, conversation("t", LINES, t0), urgent=True
        )
        failed = await wait_status(handle, lambda s: s.rounds_failed == 1, env=env, step_s=5)
        assert len(emulator.requests) == 3  # retried, then given up
        assert "MalformedModelOutput" in (failed.last_error or "")
        assert failed.rounds[-1].status == "failed"
        assert failed.pending_turns == len(LINES)
        assert failed.watermarks["t"].indexed == 0
        assert await mw.store.count(user) == 0
        round_id = failed.rounds[-1].workflow_id
        desc = await env.client.get_workflow_handle(round_id).describe()
        assert desc.status is not None and desc.status.name == "FAILED"
