"""Main-chat token usage: read from the responses through `create_agent`, counted in Prometheus
in the agent process and carried to the user's ledger (dev server, real worker and stores)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from prometheus_client import CollectorRegistry
from pydantic import Field
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from mnemoflow.devstack.processes import free_port
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.middleware.chat_usage import ChatTokenMetrics, response_usage
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import SubmitEvent, UserMemoryState
from mnemoflow.models.search_attributes import ALL_KEYS
from mnemoflow.models.usage import CostLedger, LLMUsage
from mnemoflow.ops.inspect import render
from mnemoflow.workflows import state_ops
from tests.middleware.conftest import LiveMemory
from tests.support.temporal import binary

LINES = ["Hi, I'm Ada.", "My order is 7734-221.", "I prefer email."]


@dataclass
class Ctx:
    user_id: str


class MeteredModel(BaseChatModel):
    """Answers "ok", reporting 100 + 10 per request message input tokens (20 from the
    provider's cache) and 5 output tokens, as a provider's usage_metadata; keeps what it
    reported."""

    reported: list[int] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "metered"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        tokens_in = 100 + 10 * len(messages)
        self.reported.append(tokens_in)
        reply = AIMessage(
            "ok",
            usage_metadata={
                "input_tokens": tokens_in,
                "output_tokens": 5,
                "total_tokens": tokens_in + 5,
                "input_token_details": {"cache_read": 20},
            },
        )
        return ChatResult(generations=[ChatGeneration(message=reply)])


def test_usage_is_read_from_ai_messages_only() -> None:
    ai = AIMessage("x", usage_metadata={"input_tokens": 9, "output_tokens": 2, "total_tokens": 11})
    assert response_usage(ai) == LLMUsage(calls=1, input_tokens=9, output_tokens=2)
    assert response_usage(AIMessage("no usage")) is None
    assert response_usage(HumanMessage("hi")) is None


def test_the_ledger_counts_an_events_usage_once() -> None:
    s = UserMemoryState()
    usage = LLMUsage(calls=2, input_tokens=300, output_tokens=10)
    event = SubmitEvent(event_id="e1", turns=[], chat_usage=usage)
    for _ in range(2):  # a re-sent event (same id) is not counted again
        state_ops.absorb_submit(s, event, MemoryConfig(), 0.0)
    state_ops.absorb_submit(s, SubmitEvent(event_id="e2", turns=[]), MemoryConfig(), 0.0)
    assert s.ledger.chat == usage
    assert s.ledger.cost == 0.0, "chat tokens are not priced at the memory models' prices"


@pytest.mark.integration
async def test_chat_tokens_reach_the_ledger_and_prometheus(live_memory: LiveMemory) -> None:
    registry = CollectorRegistry()
    client, user = live_memory.client, live_memory.new_user("metered")
    t0 = time.time() - 3 * 3600
    memory = DurableMemoryMiddleware(
        client=client, metrics=ChatTokenMetrics(registry), clock=lambda: t0
    )
    model = MeteredModel()
    agent = create_agent(
        model, [], middleware=[memory], context_schema=Ctx, checkpointer=InMemorySaver()
    )
    for text in LINES:
        await agent.ainvoke(
            {"messages": [HumanMessage(text)]},
            {"configurable": {"thread_id": "t"}},
            context=Ctx(user),
        )
    await memory.flush()
    status = await client.settle(user, 90)
    assert len(model.reported) == 3
    tokens_in = sum(model.reported)
    expected = LLMUsage(
        calls=3,
        input_tokens=tokens_in,
        output_tokens=15,
        cache_hit_tokens=60,
        cache_miss_tokens=tokens_in - 60,
    )
    assert status is not None and status.ledger.chat == expected
    sample = registry.get_sample_value
    assert sample("mnemoflow_chat_calls_total") == 3
    assert sample("mnemoflow_chat_tokens_total", {"kind": "input"}) == tokens_in
    assert sample("mnemoflow_chat_tokens_total", {"kind": "output"}) == 15
    assert sample("mnemoflow_chat_tokens_total", {"kind": "cache_hit"}) == 60


def test_inspect_shows_the_chat_tokens() -> None:
    ledger = CostLedger(chat=LLMUsage(calls=3, input_tokens=420, output_tokens=15))
    report = {
        "user_id": "ada",
        "workflow": "mnemoflow-user-ada-0",
        "profile": {},
        "fragments": [],
        "rounds": [],
        "costs": ledger.model_dump(),
    }
    assert "main chat model (reported by the agent, unpriced): 3 calls, 420 in, 15 out" in (
        render(report)
    )


@pytest.mark.integration
async def test_usage_of_failed_hand_overs_goes_with_the_next() -> None:
    """Temporal down for two turns, then up on the same address: the third turn's hand-over
    carries all three calls' usage (read back from the signal in the workflow's history)."""
    port = free_port()
    temporal = await Client.connect(
        f"127.0.0.1:{port}", lazy=True, data_converter=pydantic_data_converter
    )
    client = MemoryClient(temporal=temporal, task_queue="nobody", signal_timeout_s=2.0)
    model = MeteredModel()
    memory = DurableMemoryMiddleware(client=client, metrics=ChatTokenMetrics())
    agent = create_agent(
        model, [], middleware=[memory], context_schema=Ctx, checkpointer=InMemorySaver()
    )
    user, config = f"offline-{uuid.uuid4().hex[:8]}", {"configurable": {"thread_id": "t"}}
    for text in LINES[:2]:
        await agent.ainvoke({"messages": [HumanMessage(text)]}, config, context=Ctx(user))
    await memory.flush()
    assert (await agent.aget_state(config)).values.get("memory_accepted", {}) == {}
    env = await WorkflowEnvironment.start_local(
        port=port,
        data_converter=pydantic_data_converter,
        dev_server_existing_path=binary("temporal"),
        search_attributes=list(ALL_KEYS),
        dev_server_log_level="error",
    )
    try:
        await agent.ainvoke({"messages": [HumanMessage(LINES[2])]}, config, context=Ctx(user))
        await memory.flush()
        handle = env.client.get_workflow_handle(client.workflow_id(user))
        carried = []
        async for event in handle.fetch_history_events():
            signal = event.workflow_execution_signaled_event_attributes
            if event.HasField("workflow_execution_signaled_event_attributes"):
                [submitted] = await env.client.data_converter.decode(
                    signal.input.payloads, [SubmitEvent]
                )
                carried.append(submitted.chat_usage)
        assert len(model.reported) == 3 and len(carried) == 1, carried
        assert carried[0] is not None and carried[0].calls == 3
        assert carried[0].input_tokens == sum(model.reported)
        await handle.terminate("test over")
    finally:
        await client.aclose()
        await env.shutdown()
