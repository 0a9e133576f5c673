"""Swap a LangGraph store for MnemoflowStore: the same `put` / `get` / `search` / `delete`, and
LangMem's memory tools unchanged, with memory that survives a crashed worker, is ordered per user
across processes and is forgotten for good (README, "Already using a LangGraph store?").

    .venv/bin/mnemoflow dev &                 # in another terminal
    .venv/bin/python examples/langgraph_store.py

It stores, finds, overwrites and deletes a user's memories through the store, as LangMem's tools
do, and prints what each step returned. With DEEPSEEK_API_KEY set it then runs an agent with
LangMem's tools on the same store: it remembers a fact in one thread and recalls it in another.
The stack is found as the `mnemoflow` commands find it (README, "Connecting to a running stack").
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from mnemoflow import MemoryOutageGuard, MnemoflowStore, Settings, connect
from mnemoflow.ops.target import NoTargetError, resolve_target
from mnemoflow.worker.memory_client import memory_client

#: LangMem's own template; MnemoflowStore reads the user from the same place.
NAMESPACE = ("memories", "{langgraph_user_id}")


async def main() -> int:
    try:
        target = resolve_target(Settings.load())
    except NoTargetError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"using {target.description}", file=sys.stderr)
    settings = target.settings
    user = f"ada-{uuid.uuid4().hex[:6]}"
    ns = ("memories", user)
    async with memory_client(await connect(settings.temporal), settings) as memory:
        # Before: store = InMemoryStore()
        store = MnemoflowStore(memory, namespace=("memories", "{user_id}"))

        await store.aput(ns, "tea", {"content": "Ada drinks green tea, no sugar"})
        await store.aput(ns, "order", {"content": "Order 7734-221 arrived late", "open": True})
        print("get:", (await store.aget(ns, "tea")).value)  # type: ignore[union-attr]
        for item in await store.asearch(ns, query="what does Ada drink?", limit=2):
            print(f"search: {item.key} {item.score:.3f} {item.value}")
        await store.aput(ns, "tea", {"content": "Ada switched to oolong"})  # overwrite
        print("after overwrite:", [i.value for i in await store.asearch(ns, query="tea")])
        await store.adelete(ns, "order")  # forget_fragment: gone from Milvus, Redis, context
        print("after delete:", [i.key for i in await store.asearch(ns)])

        if os.environ.get("DEEPSEEK_API_KEY"):
            await agent_demo(store, user)
    return 0


async def agent_demo(store: MnemoflowStore, user: str) -> None:
    """LangMem's tools on the store, unchanged: remember in one thread, recall in another."""
    from langchain.agents import create_agent
    from langchain_deepseek import ChatDeepSeek
    from langgraph.checkpoint.memory import InMemorySaver
    from langmem import create_manage_memory_tool, create_search_memory_tool

    agent = create_agent(
        ChatDeepSeek(model="deepseek-chat"),
        tools=[create_manage_memory_tool(NAMESPACE), create_search_memory_tool(NAMESPACE)],
        store=store,
        middleware=[MemoryOutageGuard()],  # memory down: the tool answers, the turn goes on
        checkpointer=InMemorySaver(),
    )
    for thread, text in [
        ("t1", "Please remember that my cat is called Mochi."),
        ("t2", "What is my cat called? Search your memory."),
    ]:
        config = {"configurable": {"thread_id": thread, "langgraph_user_id": user}}
        out = await agent.ainvoke({"messages": [{"role": "user", "content": text}]}, config)
        print(f"{thread}: {out['messages'][-1].content}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
