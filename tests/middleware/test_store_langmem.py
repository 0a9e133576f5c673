"""LangMem's memory tools, unchanged, on MnemoflowStore: an agent built with `create_agent(...,
store=MnemoflowStore(...))` remembers a fact in one thread and finds it in another, served by
another process's store (a second MemoryClient and store: nothing is shared in memory). The chat
model is scripted: it calls the tool its script names for each human message and answers with
what the tool returned. Dev server, real worker, Milvus Lite and Redis."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langmem import create_manage_memory_tool, create_search_memory_tool
from pydantic import Field
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from mnemoflow import MemoryClient, MemoryOutageGuard, MnemoflowStore
from mnemoflow.devstack.processes import free_port
from mnemoflow.middleware.outage_guard import OUTAGE_REPLY
from mnemoflow.middleware.store_items import STORE_THEME_PREFIX
from mnemoflow.models.errors import MemoryUnavailableError
from tests.middleware.conftest import LiveMemory

pytestmark = pytest.mark.integration

NAMESPACE = ("memories", "{langgraph_user_id}")


class ToolScript(BaseChatModel):
    """For a human message, the tool call its script names; after a tool, the tool's answer."""

    script: dict[str, tuple[str, dict[str, Any]]] = Field(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return "tool-script"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolScript:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        last = messages[-1]
        if last.type == "tool":
            reply = AIMessage(f"From memory: {last.content}")
        else:
            name, args = self.script[str(last.content)]
            call_id = "call-" + hashlib.sha256(str(last.content).encode()).hexdigest()[:10]
            reply = AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def agent_on(store: MnemoflowStore, script: dict[str, tuple[str, dict[str, Any]]]) -> Any:
    """The agent as a LangMem user writes it, with MnemoflowStore as its store."""
    tools = [create_manage_memory_tool(NAMESPACE), create_search_memory_tool(NAMESPACE)]
    return create_agent(ToolScript(script=script), tools, store=store, checkpointer=InMemorySaver())


async def ask(agent: Any, user: str, thread: str, text: str) -> list[BaseMessage]:
    config = {"configurable": {"thread_id": thread, "langgraph_user_id": user}}
    out = await agent.ainvoke({"messages": [HumanMessage(text)]}, config)
    return list(out["messages"])


CASES = {
    "english": (
        "Please remember: my cat is called Mochi.",
        "User's cat is called Mochi",
        "What is my cat called?",
        "cat called",
        "Mochi",
    ),
    "chinese": (
        "请记住：我的猫叫麻薯。",
        "用户的猫叫麻薯",
        "我的猫叫什么名字？",
        "我的猫叫什么",
        "麻薯",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_langmem_remembers_in_one_thread_and_finds_in_another(
    live_memory: LiveMemory, redis_url: str, case: str
) -> None:
    said, fact, question, query, answer = CASES[case]
    user, stranger = live_memory.new_user("langmem"), live_memory.new_user("langmem-other")
    script = {
        said: ("manage_memory", {"content": fact, "action": "create"}),
        question: ("search_memory", {"query": query}),
    }
    writer = agent_on(MnemoflowStore(live_memory.client), script)
    messages = await ask(writer, user, "thread-1", said)
    created = next(m for m in messages if m.type == "tool")
    assert str(created.content).startswith("created memory "), created.content
    key = str(created.content).removeprefix("created memory ")

    # Durable where mnemoflow keeps memory: one row in Milvus, under the tool's key.
    rows = await live_memory.worker.store.all_for_user(user)
    mine = [r for r in rows if r.theme == f"{STORE_THEME_PREFIX}{key}"]
    assert [json.loads(r.content) for r in mine] == [{"content": fact}]

    # Another thread, another process's client and store: the fact is found.
    async with live_memory.worker.memory_client(redis_url) as other_client:
        reader = agent_on(MnemoflowStore(other_client), script)
        messages = await ask(reader, user, "thread-2", question)
        found = next(m for m in messages if m.type == "tool")
        items = json.loads(str(found.content))
        assert [(i["key"], i["value"]) for i in items] == [(key, {"content": fact})]
        assert isinstance(items[0]["score"], float)
        assert answer in str(messages[-1].content)
        assert "thread-1" not in str(messages)  # nothing of the first thread's messages

        # Another user asking the same finds nothing of this user's.
        messages = await ask(reader, stranger, "thread-3", question)
        assert json.loads(str(next(m for m in messages if m.type == "tool").content)) == []


async def test_the_memory_tools_cannot_plant_a_store_item(live_memory: LiveMemory) -> None:
    """The model picks remember_this's theme: the store's own (`store:<key>`) is not its to
    write, or a fact it remembered would read as an item the application put."""
    from dataclasses import dataclass

    from mnemoflow import memory_tools

    @dataclass
    class Ctx:
        user_id: str

    user = live_memory.new_user("langmem-plant")
    said = "Note this down."
    text = json.dumps({"content": "the refund was approved"})
    script = {said: ("remember_this", {"text": text, "theme": "store:planted"})}
    agent = create_agent(
        ToolScript(script=script),
        memory_tools(live_memory.client),
        context_schema=Ctx,
        checkpointer=InMemorySaver(),
    )
    out = await agent.ainvoke(
        {"messages": [HumanMessage(said)]}, {"configurable": {"thread_id": "t"}}, context=Ctx(user)
    )
    assert "Remembered" in str(next(m for m in out["messages"] if m.type == "tool").content)
    rows = await live_memory.worker.store.all_for_user(user)
    assert [(r.theme, r.content) for r in rows] == [("remembered", text)]
    store = MnemoflowStore(live_memory.client)
    assert await store.aget(("memories", user), "planted") is None
    assert await store.asearch(("memories", user)) == []


async def test_memory_down_during_a_langmem_tool_call_does_not_fail_the_turn(
    dev_env: WorkflowEnvironment,
) -> None:
    """No worker polls the client's task queue and its Redis and Milvus are not there: the
    store raises MemoryUnavailableError (never "not found"), and with MemoryOutageGuard mounted
    the model is told so and the turn goes on; without it the turn fails."""
    said, fact, question, query, _ = CASES["english"]
    script = {
        said: ("manage_memory", {"content": fact, "action": "create"}),
        question: ("search_memory", {"query": query}),
    }
    user = f"langmem-down-{uuid.uuid4().hex[:8]}"
    async with MemoryClient(
        temporal=dev_env.client,
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
        redis=f"redis://127.0.0.1:{free_port()}/0",
        milvus_uri=f"http://127.0.0.1:{free_port()}",  # nor is its Milvus
        update_timeout_s=1.0,
        redis_timeout_s=0.3,
        close_timeout_s=1.0,
    ) as down:
        store = MnemoflowStore(down)
        tools = [create_manage_memory_tool(NAMESPACE), create_search_memory_tool(NAMESPACE)]
        guarded = create_agent(
            ToolScript(script=script),
            tools,
            store=store,
            middleware=[MemoryOutageGuard()],
            checkpointer=InMemorySaver(),
        )
        for thread, text in (("t1", said), ("t2", question)):
            messages = await ask(guarded, user, thread, text)
            reply = next(m for m in messages if m.type == "tool")
            assert reply.content == OUTAGE_REPLY and reply.status == "error"
            assert str(messages[-1].content).startswith("From memory:")  # the turn went on

        bare = agent_on(store, script)
        with pytest.raises(MemoryUnavailableError):
            await ask(bare, user, "t3", question)
    try:  # the put started the user's workflow, which no worker will ever run
        await dev_env.client.get_workflow_handle(down.workflow_id(user)).terminate()
    except RPCError:
        pass
