"""The forget_memory tool takes effect for the rest of the same turn: the model call after it
gets neither the fragment the turn's search found before the forget nor the one the published
context held. Through create_agent with DurableMemoryMiddleware and memory_tools, on the dev
server with the real worker, Redis and Milvus Lite."""

from __future__ import annotations

import time

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from temporalio.testing import WorkflowEnvironment

from mnemoflow.middleware import memory_tools
from tests.middleware.test_agent_integration import (
    ScriptedModel,
    harness,
    new_user,
    stack,
    tool_call,
)
from tests.support.drive import eventually

pytestmark = pytest.mark.integration

SECRET = "My PIN hint is the name of my dog, Rexford."
QUESTION = "Please forget my PIN hint about my dog Rexford."


async def test_a_fragment_forgotten_by_the_tool_is_not_injected_later_in_the_turn(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with stack(dev_env, milvus_uri, redis_url) as (mw, client):
        user = new_user("forget-turn")
        mw.track(client.workflow_id(user))
        kept = await client.remember(user, "I collect vintage fountain pens.")
        secret = await client.remember(user, SECRET)

        async def searchable() -> bool:  # the corpus and the read model hold both
            found = await client.search(user, "PIN hint dog Rexford", time.time())
            context = await client.context(user)
            return (
                found is not None
                and secret.fragment_id in {f.id for f in found}
                and context is not None
                and {kept.fragment_id, secret.fragment_id} <= {f.id for f in context.fragments}
            )

        await eventually(searchable, deadline_s=60, what="the fragments searchable")

        model = ScriptedModel(
            script=[
                tool_call("forget_memory", {"fragment_id": secret.fragment_id}),
                AIMessage("Done, I forgot it."),
            ]
        )
        h = harness(client, tools=memory_tools(client), model=model)
        out = await h.turn(user, "t1", QUESTION)
        await h.mw.flush()

        tool_results = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        before, after = model.system_prompt(0), model.system_prompt(1)
        print(
            f"tool: {tool_results[0].content!r}; model call 1 had the secret: "
            f"{'Rexford' in before}; model call 2: {'Rexford' in after}"
        )
        assert tool_results[0].content == f"Forgot memory {secret.fragment_id}."
        assert "Rexford" in before, "the first model call gets the fragment (the test can fail)"
        assert "Rexford" not in after, "a forgotten fragment was injected later in the same turn"
        assert len(model.seen) == 2


async def test_forgetting_a_remembered_fact_also_forgets_the_conversation_that_said_it(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """The user asks the agent to remember a fact: it is stored twice, as the explicit memory
    and in the fragment of the conversation it was said in. Forgetting the memory by its id
    (as recall shows it) must leave neither, while what else the user said stays."""
    fact = "My son Leo 2468 is allergic to peanuts."
    kept = "My daughter Ada 9753 plays the cello on Sundays."
    async with stack(dev_env, milvus_uri, redis_url) as (mw, client):
        user = new_user("forget-copies")
        mw.track(client.workflow_id(user))
        model = ScriptedModel(
            script=[tool_call("remember_this", {"text": fact}), AIMessage("Noted.")]
        )
        h = harness(client, tools=memory_tools(client), model=model)
        await h.turn(user, "t1", f"Please remember this: {fact}")
        await h.turn(user, "t2", kept)
        await h.mw.flush()
        for thread in ("t1", "t2"):
            await client.consolidate(user, thread)
        await client.settle(user, 120)
        rows = [f.content for f in await mw.store.all_for_user(user)]
        assert sum(fact in r for r in rows) == 2, rows  # the memory and the conversation
        memory_id = next(
            f.id
            for f in (await client.recall(user, "Leo allergic peanuts")).fragments
            if f.content.strip() == fact
        )

        async def searchable() -> bool:  # the agent's search index holds both copies
            found = await client.search(user, "Leo allergic peanuts", time.time())
            return found is not None and sum(fact in f.content for f in found) >= 1

        await eventually(searchable, deadline_s=60, what="the copies searchable")
        forget = tool_call("forget_memory", {"fragment_id": memory_id})
        model.script.extend([forget, AIMessage("ok")])
        out = await h.turn(user, "t3", "Forget what I told you about my son.")
        await h.mw.flush()
        said = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
        await client.consolidate(user, "t3")
        await client.settle(user, 120)
        rows = [f.content for f in await mw.store.all_for_user(user)]
        hits = [f.content for f in (await client.recall(user, "Leo allergic peanuts")).fragments]
        print(f"tool: {said}; rows with the fact {sum(fact in r for r in rows)}; recall {hits}")
        assert said and said[0].startswith(f"Forgot memory {memory_id} and 1 other")
        assert not [r for r in rows if "2468" in r], rows
        assert not [h for h in hits if "2468" in h]
        assert sum(kept in r for r in rows) == 1, "a fragment without the fact was forgotten"


async def test_a_text_too_long_to_remember_is_refused_whole_never_cut(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """`remember` cut a text past 8,000 characters and said nothing: the stored memory lacked
    its end. It is refused with a clear error (the tool tells the model, the turn goes on), and
    a text at the bound is stored whole."""
    from mnemoflow.middleware.client import MAX_REMEMBER_CHARS
    from mnemoflow.models.errors import InvalidInputError

    tail = "and the spare key is under the blue flowerpot 8841."
    at_bound = "x" * (MAX_REMEMBER_CHARS - len(tail) - 1) + " " + tail
    too_long = "y" * MAX_REMEMBER_CHARS + " " + tail
    async with stack(dev_env, milvus_uri, redis_url) as (mw, client):
        user = new_user("remember-bound")
        mw.track(client.workflow_id(user))
        with pytest.raises(InvalidInputError, match="at most 8000"):
            await client.remember(user, too_long)
        with pytest.raises(InvalidInputError, match="empty"):
            await client.remember(user, "   ")
        kept = await client.remember(user, at_bound)
        model = ScriptedModel(
            script=[tool_call("remember_this", {"text": too_long}), AIMessage("I could not.")]
        )
        h = harness(client, tools=memory_tools(client), model=model)
        out = await h.turn(user, "t1", "Remember my very long note, please.")
        said = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
        assert said and said[0].startswith("Not remembered: text to remember is 8052")
        rows = {f.id: f.content for f in await mw.store.all_for_user(user)}
        assert rows[kept.fragment_id] == at_bound
        assert not [c for c in rows.values() if c.startswith("y")]
