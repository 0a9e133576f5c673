"""forget_fragment and the profile, on the dev server with the production wiring.

After forget_fragment(X) returns, no profile fact X stated remains (in the profile query nor in
the published read model) unless another kept fragment states it too; the facts the other
fragments state stay, or come back. Each test says one distinct fact per fragment and counts
the facts said against the facts in the profile.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.base import InductedProfile
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware.client import MemoryClient
from mnemoflow.models.contracts import ForgetFragmentRequest, ForgetFragmentResult
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.models.profile import PROFILE_LIST_FIELDS, UserProfile
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import MemoryWorker, memory_worker
from tests.support.replay import assert_replays

DAY = 86_400.0


@dataclass(frozen=True)
class Said:
    thread: str
    line: str
    proof: str  # what the profile holds when it holds this fact


SAID = [
    Said("name", "My name is Odile Brandt.", "Odile Brandt"),
    Said("order", "My order number is 7734.", "7734"),
    Said("hobby", "I love hiking.", "hiking"),
    Said("goal", "I want to learn Welsh.", "learn Welsh"),
    Said("diet", "I am vegan.", "vegan"),
]


def said_turns(said: list[Said], t0: float, tag: str = "") -> list:
    turns = []
    for k, fact in enumerate(said):
        turns += conversation(fact.thread + tag, [fact.line, "Noted."], t0 + k * 600)
    return turns


def facts_in(profile: UserProfile | None, said: list[Said]) -> set[str]:
    blob = json.dumps(profile.model_dump() if profile else {}, ensure_ascii=False)
    return {fact.proof for fact in said if fact.proof in blob}


async def start_user(mw: MemoryWorker, said: list[Said], t0: float) -> tuple[str, WorkflowHandle]:
    """One hand-over of one thread per fact, all old enough to be inducted at once: the rounds
    run first (each thread due now), then one induction of every fragment."""
    user = f"odile-{uuid.uuid4().hex[:6]}"
    handle = await submit(mw.client, mw.task_queue, user, said_turns(said, t0), urgent=True)
    return user, handle


async def fragment_of(mw: MemoryWorker, user: str, proof: str) -> Fragment:
    rows = [f for f in await mw.store.all_for_user(user) if proof in f.content]
    assert len(rows) == 1, rows
    return rows[0]


async def published_profile(client: MemoryClient, user: str) -> UserProfile | None:
    context = await client.context(user)
    return context.profile if context is not None else None


async def assert_facts(client: MemoryClient, user: str, kept: set[str]) -> None:
    """The profile holds exactly `kept` of the facts said, in the workflow and in Redis."""
    assert facts_in(await client.profile(user), SAID) == kept
    assert facts_in(await published_profile(client, user), SAID) == kept


async def forget(handle: WorkflowHandle, fragment_id: str) -> ForgetFragmentResult:
    return await handle.execute_update(
        UserMemoryWorkflow.forget_fragment, ForgetFragmentRequest(fragment_id=fragment_id)
    )


async def test_forgetting_one_fragment_of_a_batch_removes_only_its_facts(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        client = mw.memory_client(redis_url)
        user, handle = await start_user(mw, SAID, time.time() - 4 * DAY)
        st = await wait_status(
            handle, lambda s: s.inductions >= 1 and s.uninducted == 0, what="one induction"
        )
        assert st.inductions == 1 and st.rounds_completed == len(SAID)  # one batch of all
        assert facts_in(await client.profile(user), SAID) == {f.proof for f in SAID}

        for k, gone in enumerate(SAID[:2]):
            fragment = await fragment_of(mw, user, gone.line)
            result = await forget(handle, fragment.id)
            assert result.deleted == 1 and result.profile_facts_removed == 1
            kept = {f.proof for f in SAID[k + 1 :]}
            await assert_facts(client, user, kept)
        await client.aclose()
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="forget-facts-batch")


class GatedInduct(HeuristicMemoryModels):
    """The heuristic inducer, held at a gate the test opens (an induction in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()

    async def induct(self, profile: UserProfile, fragments: list[Fragment]) -> InductedProfile:
        self.started.set()
        await self.gate.wait()
        return await super().induct(profile, fragments)


async def test_a_fragment_forgotten_while_its_induction_runs_never_reaches_the_profile(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    models = GatedInduct()
    models.gate.clear()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        client = mw.memory_client(redis_url)
        user, handle = await start_user(mw, SAID, time.time() - 4 * DAY)
        await asyncio.wait_for(models.started.wait(), 120)
        gone = await fragment_of(mw, user, SAID[0].line)
        result = await forget(handle, gone.id)
        assert result.deleted == 1
        models.gate.set()
        await wait_status(handle, lambda s: s.inductions >= 1 and s.uninducted == 0)
        kept = {f.proof for f in SAID[1:]}
        await assert_facts(client, user, kept)
        await client.aclose()
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="forget-facts-late")


async def test_a_fact_forgotten_while_another_induction_runs_stays_forgotten(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """The induction in flight started from the profile that still held the fact."""
    models = GatedInduct()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        client = mw.memory_client(redis_url)
        t0 = time.time() - 4 * DAY
        user, handle = await start_user(mw, SAID[:3], t0)
        await wait_status(handle, lambda s: s.inductions == 1 and s.uninducted == 0)
        assert facts_in(await client.profile(user), SAID) == {f.proof for f in SAID[:3]}
        models.gate.clear()
        models.started.clear()
        await submit(mw.client, mw.task_queue, user, said_turns(SAID[3:], t0 + DAY), urgent=True)
        await asyncio.wait_for(models.started.wait(), 120)
        gone = await fragment_of(mw, user, SAID[0].line)
        result = await forget(handle, gone.id)
        assert result.profile_facts_removed == 1
        models.gate.set()
        await wait_status(handle, lambda s: s.inductions == 2 and s.uninducted == 0)
        kept = {f.proof for f in SAID[1:]}
        await assert_facts(client, user, kept)
        await client.aclose()
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="forget-facts-stale")


async def test_a_fact_restated_by_a_kept_fragment_stays(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        client = mw.memory_client(redis_url)
        t0 = time.time() - 4 * DAY
        user, handle = await start_user(mw, SAID[:1], t0)
        await wait_status(handle, lambda s: s.inductions == 1 and s.uninducted == 0)
        again = Said("again", "Again, my name is Odile Brandt and I love hiking.", "hiking")
        await submit(mw.client, mw.task_queue, user, said_turns([again], t0 + DAY), urgent=True)
        await wait_status(handle, lambda s: s.inductions == 2 and s.uninducted == 0)
        both = [SAID[0], again]
        assert facts_in(await client.profile(user), both) == {"Odile Brandt", "hiking"}

        first = await fragment_of(mw, user, SAID[0].line)
        result = await forget(handle, first.id)
        assert result.profile_facts_removed == 0  # the kept fragment states the name too
        assert facts_in(await client.profile(user), both) == {"Odile Brandt", "hiking"}
        second = await fragment_of(mw, user, again.line)
        result = await forget(handle, second.id)
        assert result.profile_facts_removed == 2
        assert facts_in(await client.profile(user), both) == set()
        assert facts_in(await published_profile(client, user), both) == set()
        await client.aclose()
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="forget-facts-again")


class ParaphrasingInduct(GatedInduct):
    """An inducer that words every fact its own way (as an LLM may): no fragment holds the
    fact's words, so which fragment stated it cannot be told. Held at the gate like
    `GatedInduct` (open unless the test closes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    async def induct(self, profile: UserProfile, fragments: list[Fragment]) -> InductedProfile:
        self.batches.append(len(fragments))
        inducted = await super().induct(profile, fragments)
        update = inducted.update.model_copy(
            update={
                "name": f"{inducted.update.name} (inferred)" if inducted.update.name else None,
                **{
                    field: [f"{v} (inferred)" for v in getattr(inducted.update, field)]
                    for field in PROFILE_LIST_FIELDS
                },
                "business_fields": {
                    k: f"{v} (inferred)" for k, v in inducted.update.business_fields.items()
                },
            }
        )
        return InductedProfile(update=update, usage=inducted.usage)


async def test_facts_that_cannot_be_attributed_go_and_the_others_are_inducted_again(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    models = ParaphrasingInduct()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        client = mw.memory_client(redis_url)
        user, handle = await start_user(mw, SAID, time.time() - 4 * DAY)
        await wait_status(handle, lambda s: s.inductions == 1 and s.uninducted == 0)
        assert facts_in(await client.profile(user), SAID) == {f.proof for f in SAID}
        gone = await fragment_of(mw, user, SAID[0].line)
        # The induction of the kept fragments waits at the gate until the profile has been
        # read: it may follow the forget at once (one CI run read its facts already back).
        models.gate.clear()
        result = await forget(handle, gone.id)
        # Privacy first: every fact of the batch could be the forgotten fragment's.
        assert result.profile_facts_removed == len(SAID)
        assert facts_in(await client.profile(user), SAID) == set()
        assert facts_in(await published_profile(client, user), SAID) == set()
        # The other fragments are inducted again: the facts they state come back.
        models.gate.set()
        kept = {f.proof for f in SAID[1:]}
        await wait_status(handle, lambda s: s.inductions == 2 and s.uninducted == 0)
        assert models.batches == [len(SAID), len(SAID) - 1]
        await assert_facts(client, user, kept)
        await client.aclose()
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="forget-facts-unsure")


async def test_a_delete_whose_reply_was_lost_still_forgets_the_facts(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """The delete reaches Milvus and its reply is lost (the worker dies after it): the retried
    activity finds no row and deletes 0. The fragment was the user's all the same: its facts
    leave the profile and the read model, and the caller hears it was deleted."""
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        client = mw.memory_client(redis_url)
        user, handle = await start_user(mw, SAID, time.time() - 4 * DAY)
        await wait_status(
            handle, lambda s: s.inductions >= 1 and s.uninducted == 0, what="one induction"
        )
        gone = SAID[1]
        fragment = await fragment_of(mw, user, gone.line)
        real_delete, attempts = mw.store.delete, []

        async def delete_then_lose_the_reply(user_id: str, ids: list[str]) -> int:
            attempts.append(ids)
            deleted = await real_delete(user_id, ids)
            if len(attempts) == 1:
                raise ConnectionError("the reply of the delete was lost")
            return deleted

        mw.store.delete = delete_then_lose_the_reply  # type: ignore[method-assign]
        result = await forget(handle, fragment.id)
        kept = {f.proof for f in SAID if f is not gone}
        print(f"attempts {len(attempts)}, {result}")
        assert len(attempts) == 2, "the test can fail: the first attempt must be retried"
        assert result.deleted == 1 and result.profile_facts_removed == 1
        await assert_facts(client, user, kept)
        context = await client.context(user)
        assert context is not None and fragment.id not in {f.id for f in context.fragments}
        await client.aclose()
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="forget-reply-lost")
