"""Two agent processes serving the same user and thread at once, and the same turns re-sent, on
the dev server with the real worker, Redis and Milvus Lite.

Each "process" has its own MemoryClient, DurableMemoryMiddleware and checkpointer and says its
own lines, so their lists hold different messages at the same positions. Every line said must be
stored exactly once: messages are known by identity, never by position.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.middleware.window import to_turns
from mnemoflow.models.ids import user_workflow_id
from tests.support.chat import ReceiptModel, receipt
from tests.support.drive import eventually
from tests.support.invariants import Monotonic, said_vs_stored
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger

pytestmark = pytest.mark.integration

LINES = {
    "a": [
        "Hi, I'm Ada Lovelace, a data engineer.",
        "My order number is 7734-221 and it is late.",
        "I prefer email, and I'm busy on Wednesdays.",
        "My cat is called Pixel.",
    ],
    "b": [
        "Quick one from the phone: my flat is on Keswick Road 12.",
        "The parcel locker code they gave me was 5519.",
        "Please never call before ten in the morning.",
        "My sister Maud will pick it up if I am out.",
    ],
}


@dataclass
class Ctx:
    user_id: str


async def test_two_agent_processes_same_user_same_thread(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user, thread = f"twin-{uuid.uuid4().hex[:8]}", "shared"
        mw.track(user_workflow_id(user))
        clients = {k: MemoryClient(temporal=dev_env.client, task_queue=mw.task_queue) for k in "ab"}
        t0 = time.time() - 3 * 3600
        agents = {}
        for key, client in clients.items():
            middleware = DurableMemoryMiddleware(client=client, clock=lambda: t0)
            agent = create_agent(
                ReceiptModel(), [], middleware=[middleware], context_schema=Ctx,
                checkpointer=InMemorySaver(),
            )  # fmt: skip
            agents[key] = (agent, middleware)
        config = {"configurable": {"thread_id": thread}}
        for i in range(len(LINES["a"])):
            results = await asyncio.gather(
                *(
                    agent.ainvoke(
                        {
                            "messages": [
                                HumanMessage(
                                    LINES[k][i], additional_kwargs={"time": t0 + 70 * i + len(k)}
                                )
                            ]
                        },
                        config,
                        context=Ctx(user),
                    )
                    for k, (agent, _) in agents.items()
                )
            )
            for k, result in zip(agents, results, strict=True):
                assert result["messages"][-1].content == receipt(LINES[k][i])
        for _, middleware in agents.values():
            assert await middleware.flush() == 0
        said = [line for k in "ab" for text in LINES[k] for line in (text, receipt(text))]
        watch = Monotonic()

        async def indexed() -> bool:
            s = await clients["a"].status(user)
            return bool(s and watch.see(s) and s.watermarks[thread].indexed == len(said))

        await eventually(indexed, deadline_s=60, what="both processes' turns indexed")
        before = await clients["a"].status(user)
        assert before is not None
        # Every turn of b's list re-sent twice more (a retried hand-over, a resync).
        state = await agents["b"][0].aget_state(config)
        sent = await clients["b"].resync(user, thread, state.values["messages"])
        assert sent.sent == len(said) // 2
        await clients["b"].submit(user, to_turns(state.values["messages"], thread, t0)[-2:])
        after = await clients["b"].settle(user, 30)  # the re-sends absorbed
        assert after is not None and watch.see(after)
        assert after.rounds_started == before.rounds_started and after.pending_turns == 0
        assert after.watermarks[thread].accepted == len(said)
        outcome = await said_vs_stored(mw.store, user, after, {thread: said})
        assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
        for client in clients.values():
            await client.aclose()
    reliability.record(
        request,
        key="two-agent-processes",
        kind="fault",
        what="Two agent processes (own MemoryClient, middleware, checkpointer) serving the same "
        "user and thread at once, each saying its own lines; then one's turns re-sent twice",
        happened=f"each message accepted once by its identity: {len(said)} lines said, each "
        f"stored once; {outcome.rounds} rounds, {outcome.fragments} fragments; re-sends started "
        "no round",
        outcome=outcome,
        started=started,
    )
