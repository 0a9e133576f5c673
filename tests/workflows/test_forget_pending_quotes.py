"""A forgotten memory is cut out of the turns still waiting for their round that quote it: the
"please remember this" line a remembered fact came from, a reply that read it back (docs/
ARCHITECTURE.md, "Invariants"). Without that, the next round stored the forgotten words again,
everywhere: the store, the search corpus, the context.

Every line said is distinct and counted against what is stored.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.contracts import ThreadState
from mnemoflow.models.fragments import Fragment
from mnemoflow.workflows import state_ops
from tests.support.drive import conversation, eventually
from tests.support.memory_worker import memory_worker

FACTS = {
    "en": (
        "My son Leo is allergic to peanuts and his clinic file is {n}.",
        "Please remember this: {fact}",
        "Saved. You told me: {fact} I will keep it in mind.",
    ),
    "zh": (
        "我儿子乐乐对花生过敏，他的病历号是{n}。",
        "请记住：{fact}",
        "好的，已经记下：{fact}我会留意。",
    ),
}


def _pending(*texts: str) -> ThreadState:
    return ThreadState(pending=conversation("t", list(texts), 1_000.0))


def _row(content: str) -> Fragment:
    return Fragment(
        id="x", user_id="u", theme="t", types=["fact"], content=content, created_at=0.0,
        reinforced_at=0.0,
    )  # fmt: skip


def test_quoting_parts_cut_the_quote_and_leave_the_rest_and_short_lines() -> None:
    fact = "My locker at the north depot is number 4471, code 9913."
    also = "Also the south depot closes at 6."
    ts = _pending(
        f"Please remember this: {fact}",
        "Thanks!",
        fact,
        f"Noted: {fact} {also}",
        "Nothing to do with it, the bus was late today.",
    )
    parts = {t.content: left for t, left in state_ops.quoting_parts(ts, _row(fact))}
    assert parts == {
        f"Please remember this: {fact}": "Please remember this:",
        fact: None,
        f"Noted: {fact} {also}": f"Noted: {also}",
    }
    # a conversation row: each of its lines, not its speaker labels; short lines are no quotes
    row = _row(f"User: {fact}\nAssistant: Thanks!")
    assert {t.content for t, _ in state_ops.quoting_parts(ts, row)} == set(parts)
    assert state_ops.quoting_parts(_pending("Thanks!", "ok"), _row("User: Thanks!")) == []
    zh = "我儿子乐乐对花生过敏，他的病历号是0071486。"
    cut = state_ops.quoting_parts(_pending(f"请记住：{zh}", "好的"), _row(zh))
    assert [(t.content, left) for t, left in cut] == [(f"请记住：{zh}", "请记住：")]


@pytest.mark.parametrize("language", ["en", "zh"])
async def test_a_forgotten_fact_is_cut_out_of_the_turns_still_pending(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str, language: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        tag = uuid.uuid4().hex[:8]
        user = f"quote-{tag}"
        said_fact, asked, read_back = FACTS[language]
        fact = said_fact.format(n=int(tag, 16) % 10**7)
        other = [f"The courier for parcel {tag}-{n} comes at {n + 2} pm." for n in range(3)]
        lines = [asked.format(fact=fact), other[0], read_back.format(fact=fact), other[1]]
        lines += [fact, other[2]]
        async with mw.memory_client(redis_url) as client:
            mw.track(client.workflow_id(user))
            kept = await client.remember(user, f"My umbrella {tag} is teal.")
            remembered = await client.remember(user, fact)
            await client.submit(user, conversation("later", lines, time.time() - 600))

            async def accepted() -> bool:
                status = await client.status(user)
                return status is not None and status.pending_turns == len(lines)

            await eventually(accepted, deadline_s=30, what="the turns pending")
            forgot = await client.forget_fragment(user, remembered.fragment_id, quotes=True)
            assert forgot.deleted == 1
            status = await client.status(user)
            assert status is not None and status.pending_turns == len(lines) - 1  # said alone

            await client.consolidate(user, "later")
            assert await client.settle(user, 120) is not None
            stored = [f.content for f in await mw.store.all_for_user(user)]
            text = "\n".join(stored)
            assert fact not in text, stored
            assert {line: text.count(line) for line in other} == dict.fromkeys(other, 1), stored
            assert asked.format(fact="").strip() in text  # what the turn said besides
            rows = {f.id: f.content for f in await mw.store.all_for_user(user)}
            assert rows.get(kept.fragment_id) == f"My umbrella {tag} is teal."
            context = await client.context(user)
            assert context is not None
            assert fact not in context.model_dump_json(), "the forgotten fact was published"


class HeldSlice(HeuristicMemoryModels):
    """The offline models, whose slice of a batch holding `mark` waits for `release`."""

    def __init__(self, mark: str) -> None:
        super().__init__()
        self.mark = mark
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def slice(self, turns: Any, max_fragments: int) -> Any:
        if any(self.mark in t.content for t in turns):
            self.started.set()
            await asyncio.wait_for(self.release.wait(), 60)
        return await super().slice(turns, max_fragments)


async def test_a_round_running_with_the_quote_in_hand_stores_it_without_the_words(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    fact = f"My storage unit {tag} at the east yard has the gate code {int(tag, 16) % 10**6}."
    lines = [f"Please remember this: {fact}", f"Saved, unit {tag} noted.", fact, "Ok, twice."]
    models = HeldSlice(f"unit {tag} noted")
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = f"held-{tag}"
        async with mw.memory_client(redis_url) as client:
            mw.track(client.workflow_id(user))
            remembered = await client.remember(user, fact)
            await client.submit(user, conversation("said", lines, time.time() - 600), urgent=True)
            await asyncio.wait_for(models.started.wait(), 60)  # the round holds the turns
            forgetting = asyncio.ensure_future(
                client.forget_fragment(user, remembered.fragment_id, quotes=True)
            )

            async def waits() -> bool:  # the forget cut the turns the round holds
                status = await client.status(user)
                return status is not None and status.pending_turns == len(lines) - 1

            await eventually(waits, deadline_s=30, what="the forget to cut the pending turns")
            assert not forgetting.done()
            models.release.set()
            assert (await asyncio.wait_for(forgetting, 60)).deleted == 1
            assert await client.settle(user, 60) is not None
            stored = "\n".join(f.content for f in await mw.store.all_for_user(user))
            assert fact not in stored, stored
            assert all(stored.count(line) == 1 for line in (lines[1], lines[3])), stored
            assert "Please remember this:" in stored
            context = await client.context(user)
            assert context is not None and fact not in context.model_dump_json()
