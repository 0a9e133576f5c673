"""A preset changed after first contact governs the next round (time-skipping server)."""

from __future__ import annotations

import uuid

from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.memory.formulas import time_to_maturity
from mnemoflow.models.config import PRESETS, Vocation
from mnemoflow.models.ids import user_workflow_id
from tests.support.drive import conversation, status, wait_status
from tests.support.memory_worker import memory_worker

LINES = [
    "Hello, I'm Noor. I paint watercolours most evenings.",
    "That sounds lovely, Noor.",
    "I feel calmer when we talk about my garden.",
    "Then let's talk about your garden.",
]


def slice_after(vocation: Vocation) -> float:
    preset = PRESETS[vocation]
    return time_to_maturity(preset.slice_gate, preset.tau_m, preset.c_m)


async def test_next_round_waits_for_the_new_presets_slice_gate(
    time_skipping_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    env = time_skipping_env
    service, accompany = slice_after(Vocation.CUSTOMER_SERVICE), slice_after(Vocation.ACCOMPANY)
    assert service < 20 * 60 < accompany - 600  # the two gates are far apart
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        client = mw.memory_client(redis_url)  # customer service, the default preset
        user = f"noor-{uuid.uuid4().hex[:8]}"
        mw.track(user_workflow_id(user))
        t0 = (await env.get_current_time()).timestamp()
        await client.submit(user, conversation("t", LINES, t0, step=0.0))
        config = await client.update_config(user, vocation=Vocation.ACCOMPANY)
        assert config.slice_gate == PRESETS[Vocation.ACCOMPANY].slice_gate

        handle = env.client.get_workflow_handle(user_workflow_id(user))
        await env.sleep(service + 5 * 60)
        waiting = await status(handle)
        assert waiting.rounds_started == 0, "the round kept the old preset's slice gate"
        assert waiting.config is not None and waiting.config.vocation == Vocation.ACCOMPANY

        now = (await env.get_current_time()).timestamp()
        await env.sleep(t0 + accompany - 120 - now)
        assert (await status(handle)).rounds_started == 0, "sliced before the new gate"
        await env.sleep(240)
        done = await wait_status(
            handle, lambda s: s.rounds_completed == 1, env=env, what="round at the new gate"
        )
        assert done.rounds[-1].started_at >= t0 + accompany - 1
        assert done.watermarks["t"].indexed == len(LINES)
        await client.aclose()
