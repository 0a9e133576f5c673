"""Shape-4 rounds: earlier fragments travel by reference (docs/ARCHITECTURE.md, "The round").

A round records the contents of the fragments it made and nothing else: fragments of earlier
rounds that come back into the selection are named by id in its result, and the user workflow
holds them as stubs, which the publish activity fills from Redis or Milvus. So what a round
writes into Temporal's history does not grow with how many earlier fragments its selection
brings back. What the agent reads (Redis) is whole at every step: these tests count every
published fragment against the store, before and after the user workflow publishes on its own
(a remembered fact), and after Redis lost the context.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.activities.theme_weights import ThemeWeights, weights_key
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
    ActivityName,
    ForgetFragmentRequest,
    ForgetFragmentResult,
    ForgetRequest,
    InjectedContext,
    RememberRequest,
    RoundInput,
    RoundRecord,
    RoundResult,
    UserMemoryInput,
)
from mnemoflow.models.fragments import Fragment, theme_key
from mnemoflow.models.ids import epoch_key, user_key, user_workflow_id
from mnemoflow.models.params import TunedParams
from mnemoflow.models.round_store import full_id, held_by_round, theme_ref, unpack_theme_cache
from mnemoflow.workflows import state_ops
from mnemoflow.workflows.memory_round import BY_REFERENCE_SHAPE, STORED_WEIGHTS_SHAPE
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from mnemoflow.workflows.user_rounds import ROUND_SHAPE
from tests.support.drive import conversation, rounds_done, status, submit, wait_status
from tests.support.histories import payloads_text
from tests.support.memory_worker import MemoryWorker, memory_worker
from tests.support.replay import assert_replays

HOUR = 3600.0
# Five exchanges on three subjects; the fourth and fifth come back to the first two, so
# their selections bring back fragments the round before had left out. Every line distinct.
PARTS = [
    [
        "My sister Ingrid lives in Tromso and keeps three husky dogs.",
        "Three huskies in Tromso, lovely.",
    ],
    [
        "I am repainting the kitchen in a pale sage green this month.",
        "Sage green kitchen walls, noted.",
    ],
    [
        "The quarterly tax return for my bakery is due on the ninth.",
        "Bakery tax return due on the ninth.",
    ],
    [
        "Ingrid wants me to visit Tromso in February to see the huskies.",
        "A February trip to Tromso and the huskies.",
    ],
    [
        "The kitchen needs a second coat of sage green on the north wall.",
        "A second sage coat for the kitchen.",
    ],
]

# Three fragments published, one injected per model call: most of a user's fragments stay out
# of each selection, and those that come back below the first travel by id.
CONFIG = MemoryConfig.from_vocation("customer service").model_copy(
    update={"published_candidates": 3, "top_k": 1}
)


@pytest.fixture
def only_own_contents(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user workflow keeps no earlier round's fragments beyond its selection
    (state_ops.RECENT_MAX_FRAGMENTS 0; the sandbox shares the module): every earlier fragment
    that comes back travels by id, as the tests below need."""
    monkeypatch.setattr(state_ops, "RECENT_MAX_FRAGMENTS", 0)


async def _drive(
    client: Client,
    mw: MemoryWorker,
    user: str,
    *,
    last: list[str] | None = None,
    ago: float = 3 * HOUR,
) -> tuple[WorkflowHandle, list[RoundRecord]]:
    """The five parts as rounds, said `ago` seconds back (3 hours: their fragments are due
    for induction by the end)."""
    said = [*PARTS[:-1], last] if last else PARTS
    lines = [line for part in said for line in part]
    turns = conversation("t", lines, time.time() - ago)
    parts = [turns[2 * i : 2 * i + 2] for i in range(len(PARTS))]
    handle = await rounds_done(client, mw.task_queue, user, parts, config=CONFIG)
    rounds = (await status(handle)).rounds
    assert [r.status for r in rounds] == ["completed"] * len(PARTS)
    return handle, rounds


def _input(started: Any) -> RoundInput:
    attrs = started.workflow_execution_started_event_attributes
    [inp] = pydantic_data_converter.payload_converter.from_payloads(
        list(attrs.input.payloads), [RoundInput]
    )
    return inp  # type: ignore[no-any-return]


async def _forget(handle: WorkflowHandle, fid: str) -> ForgetFragmentResult:
    return await handle.execute_update(  # type: ignore[no-any-return]
        UserMemoryWorkflow.forget_fragment, ForgetFragmentRequest(fragment_id=fid)
    )


async def _whole(mw: MemoryWorker, user: str, published: InjectedContext | None) -> list[str]:
    """The published fragments' ids, after checking each is whole: its stored content."""
    assert published is not None
    ids = [f.id for f in published.fragments]
    stored = {f.id: f for f in await mw.store.get(user, ids)}
    assert set(stored) == set(ids), "a published fragment is not in the store"
    for f in published.fragments:
        assert f.content and f.content == stored[f.id].content, f.id
        assert f.theme == stored[f.id].theme and f.types == stored[f.id].types
    return ids


class CountingModels(HeuristicMemoryModels):
    """The offline models, counting the tune calls made per theme key."""

    def __init__(self) -> None:
        super().__init__()
        self.tunes: Counter[str] = Counter()

    async def tune(self, theme, samples, types):  # type: ignore[no-untyped-def]
        self.tunes[theme_key(theme)] += 1
        return await super().tune(theme, samples, types)


@pytest.mark.parametrize("shape", [BY_REFERENCE_SHAPE, STORED_WEIGHTS_SHAPE])
async def test_rounds_record_only_their_own_contents_and_what_is_published_stays_whole(
    shape: int,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    only_own_contents: None,
) -> None:
    """Shape 4 sends the theme cache compact in the input; shape 5 (every new round when the
    LLM calls share the workflow's queue) sends none: the weights are looked up in Redis."""
    from mnemoflow.workflows import user_rounds

    assert ROUND_SHAPE >= STORED_WEIGHTS_SHAPE
    monkeypatch.setattr(user_rounds, "ROUND_SHAPE", shape)  # the sandbox shares it
    client = dev_env.client
    models = CountingModels()
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = f"byref-{uuid.uuid4().hex[:8]}"
        themes = ThemeWeights(mw.read_model.redis, mw.read_model.prefix)
        handle, rounds = await _drive(client, mw, user)
        came_back = 0
        before: set[str] = set()
        tuned: dict[str, TunedParams] = {}
        for i, record in enumerate(rounds):
            round_handle = client.get_workflow_handle(record.workflow_id, result_type=RoundResult)
            result = await round_handle.result()
            assert result.by_reference and result.ranked
            inp = _input((await round_handle.fetch_history()).events[0])
            own = {r.id for r in result.fragments}
            ranked = [full_id(user, r.id) for r in result.ranked]
            # Contents of what this round made, and of the first top_k (what one model call
            # injects) that the user workflow lacked; the rest of the selection by id.
            sent = {f.id for f in result.context.fragments}
            top = ranked[: inp.config.top_k]
            lacked = set(top) - own - {full_id(user, k) for k in inp.known_fragments}
            lacked = {f for f in lacked if not held_by_round(user, f, inp.held_from_round)}
            assert sent == (own & set(ranked)) | lacked, (sent, own, top, lacked)
            assert not {full_id(user, k) for k in inp.known_fragments} & sent
            came_back += len(set(ranked) - before - own)
            before = set(ranked)
            # The steps of shape 3: two markers, one upsert, one workflow task.
            events = (await round_handle.fetch_history()).events
            assert inp.shape == shape and not inp.tuned_packed
            if shape == BY_REFERENCE_SHAPE:
                # The theme cache travels compact: every theme tuned before, by reference,
                # with its weights to half precision.
                cache = unpack_theme_cache(inp.tuned_compact)
                assert set(cache) == {theme_ref(k) for k in tuned}
                for key, params in tuned.items():
                    got = cache[theme_ref(key)].model_dump()
                    assert got == pytest.approx(params.model_dump(), rel=1e-3, abs=1e-4)
            else:
                # No cache in the input; Redis holds every theme tuned before, exactly.
                assert not inp.tuned_compact and not inp.tuned
                stored = await themes.get(user, tuned)
                assert set(stored) == set(tuned)
                for key, params in tuned.items():
                    got = stored[key].model_dump()
                    assert got == pytest.approx(params.model_dump(), abs=1e-6)
            # A theme tuned once is never tuned again.
            assert not set(result.tuned_new) & set(tuned)
            tuned.update(result.tuned_new)
            kinds = Counter(e.event_type for e in events)
            assert kinds[EventType.EVENT_TYPE_MARKER_RECORDED] == 2, kinds
            assert kinds[EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED] == 0, kinds
            assert kinds[EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES] == 1, kinds
            assert kinds[EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED] == 1, kinds
            assert len(events) == 8, kinds
            # Nothing said in earlier rounds is written into this round's history; its own
            # lines are (the search can find what it looks for).
            history = payloads_text(await round_handle.fetch_history())
            assert all(line in history for line in PARTS[i]), i
            for line in [line for part in PARTS[:i] for line in part]:
                assert line not in history, (i, line)
        assert came_back >= 1, "no earlier fragment came back into a selection: nothing tested"
        assert len(tuned) >= 2, "fewer than two themes tuned: the cache was not tested"
        assert set(models.tunes) == set(tuned) and set(models.tunes.values()) == {1}
        if shape == STORED_WEIGHTS_SHAPE:
            assert set(await themes.get(user, tuned)) == set(tuned)
        # What the agent reads is whole: the last round's selection, every content stored.
        last = await client.get_workflow_handle(
            rounds[-1].workflow_id, result_type=RoundResult
        ).result()
        published = await mw.read_model.get(user)
        ids = await _whole(mw, user, published)
        assert ids == [full_id(user, r.id) for r in last.ranked or []]
        # The workflow's own answer (a Redis miss) has no stubs: what it holds, whole. What it
        # names by id only is what came back into the last selection.
        held = await handle.query(UserMemoryWorkflow.context)
        assert all(f.content for f in held.fragments)
        held_ids = [f.id for f in held.fragments]
        assert held_ids == [fid for fid in ids if fid in held_ids]
        # What one model call injects is held whole (the fallback on a Redis miss).
        assert ids[: CONFIG.top_k] == held_ids[: CONFIG.top_k]
        stubbed = [fid for fid in ids if fid not in held_ids]
        assert stubbed, "the user workflow holds every published content: nothing tested"

        # The user workflow publishes on its own (a fragment forgotten): its stubs are filled
        # from the context Redis holds; nothing else published before is lost. Forgetting
        # what it holds whole at the head until a fragment it named by id only is first: the
        # publish hands that content back, so its own answer (a Redis miss, a client without
        # Redis) still injects what Redis does.
        assert ids[0] not in stubbed
        while ids[0] not in stubbed:
            assert (await _forget(handle, ids.pop(0))).republished
            assert await _whole(mw, user, await mw.read_model.get(user)) == ids
        held = await handle.query(UserMemoryWorkflow.context)
        assert [f.id for f in held.fragments][: CONFIG.top_k] == ids[: CONFIG.top_k]
        assert all(f.content for f in held.fragments)

        # Redis lost the context: the next publish fills the stubs from Milvus.
        assert await mw.read_model.delete(user) == 1
        kept = [fid for fid in ids if fid in stubbed]
        for fid in ids:
            if fid not in stubbed:
                assert (await _forget(handle, fid)).deleted == 1
        fact = "Remember that my bakery opens at six on Saturdays."
        await handle.execute_update(
            UserMemoryWorkflow.remember, RememberRequest(event_id="r1", content=fact)
        )
        published = await mw.read_model.get(user)
        assert published is not None and published.fragments[0].content == fact
        assert (await _whole(mw, user, published))[1:] == kept

        name = "byref" if shape == BY_REFERENCE_SHAPE else "stored"
        assert await assert_replays(client, [user_workflow_id(user)], name=f"{name}-user") == 1
        round_ids = [r.workflow_id for r in rounds]
        assert await assert_replays(client, round_ids, name=f"round-{name}") == len(round_ids)
        if shape == STORED_WEIGHTS_SHAPE:
            # Forgetting the user removes the weights with the rest of Redis's copy.
            await handle.execute_update(UserMemoryWorkflow.forget, ForgetRequest(reason="test"))
            assert await themes.get(user, tuned) == {}
            assert not await mw.read_model.redis.exists(weights_key(mw.read_model.prefix, user))


class SliceFailsOnce(CountingModels):
    """Counting models whose `n`-th slice call fails (its round's local attempt)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.slices = 0

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        self.slices += 1
        if self.slices == self.n:
            raise ConnectionError("LLM unreachable (test)")
        return await super().slice(turns, max_fragments)


async def test_tunes_as_activities_answer_with_stored_weights(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """A shape-5 round whose local LLM attempt failed tunes as ordinary activities: for a
    theme whose weights Redis holds, the activity answers with them and calls no model."""
    client = dev_env.client
    models = SliceFailsOnce(n=len(PARTS))  # the last round goes through the activities
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = f"stored-{uuid.uuid4().hex[:8]}"
        # The last round comes back to what the first was about: its themes were tuned then.
        again = [
            "Ingrid in Tromso got a fourth husky dog last week, my sister says.",
            "A fourth husky for Ingrid in Tromso.",
        ]
        _, rounds = await _drive(client, mw, user, last=again)
        last = client.get_workflow_handle(rounds[-1].workflow_id, result_type=RoundResult)
        history = await last.fetch_history()
        scheduled = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        assert ActivityName.SLICE in scheduled and ActivityName.TUNE in scheduled, scheduled
        result = await last.result()
        assert result.tuned_new == {}  # nothing new: every theme answered from Redis
        assert set(models.tunes.values()) == {1}, models.tunes
        assert result.selection is not None
        assert result.selection.params_source.startswith("tuned:"), result.selection


async def test_forgotten_fragment_held_by_reference_is_not_published_again(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str, only_own_contents: None
) -> None:
    """A fragment the user workflow names only by id, forgotten: the next publish does not
    bring it back from Redis's older copy or from anywhere else."""
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"byref-forget-{uuid.uuid4().hex[:8]}"
        handle, rounds = await _drive(client, mw, user)
        last = await client.get_workflow_handle(
            rounds[-1].workflow_id, result_type=RoundResult
        ).result()
        own = {r.id for r in last.fragments}
        ranked = [full_id(user, r.id) for r in last.ranked or []]
        earlier = [fid for fid in ranked if fid not in own]
        assert earlier, "the last selection has no earlier fragment: nothing tested"
        # The fragment named by id only (it came back into the last selection), forgotten.
        held = {f.id for f in (await handle.query(UserMemoryWorkflow.context)).fragments}
        victim = next(fid for fid in earlier if fid not in held)
        assert (await _forget(handle, victim)).deleted == 1
        fact = "Remember that the north wall is the one with the window."
        await handle.execute_update(
            UserMemoryWorkflow.remember, RememberRequest(event_id="r1", content=fact)
        )
        published = await mw.read_model.get(user)
        ids = await _whole(mw, user, published)
        assert victim not in ids
        assert published is not None and published.fragments[0].content == fact
        assert ids[1:] == [fid for fid in ranked if fid != victim]


class HeldReads(FragmentStore):
    """The production store whose reads by id wait while `gate` is set: a publish fills its
    stubs that way when Redis lost its copy of the context."""

    gate: asyncio.Event | None = None
    entered: asyncio.Event | None = None

    async def get(self, user_id: str, ids: list[str]) -> list[Fragment]:
        cls = type(self)
        if cls.gate is not None and cls.entered is not None:
            cls.entered.set()
            await cls.gate.wait()
        return await super().get(user_id, ids)


async def test_forgetting_the_user_waits_for_a_forget_fragment_republish(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str, only_own_contents: None
) -> None:
    """A forget of one fragment republishes the context; a forget of the whole user that
    comes meanwhile must not delete the read model before that publish lands (it brought the
    forgotten user's context back to Redis, with no expiry)."""
    client = dev_env.client

    class Store(HeldReads):
        pass

    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=CountingModels(), store_cls=Store
    ) as mw:
        user = f"held-{uuid.uuid4().hex[:8]}"
        # Said just now: no induction is due, so the workflow's loop is free to run the saga
        # while the forget of one fragment publishes (an induction would publish and hold it).
        handle, _ = await _drive(client, mw, user, ago=0.0)
        published = await mw.read_model.get(user)
        held = await handle.query(UserMemoryWorkflow.context)
        assert published is not None and len(published.fragments) > len(held.fragments)
        assert await mw.read_model.delete(user) == 1  # the publish fills its stubs from Milvus
        Store.gate, Store.entered = asyncio.Event(), asyncio.Event()
        one = asyncio.create_task(_forget(handle, held.fragments[0].id))
        whole: asyncio.Task[Any] | None = None
        try:
            await asyncio.wait_for(Store.entered.wait(), timeout=60)
            whole = asyncio.create_task(
                handle.execute_update(UserMemoryWorkflow.forget, ForgetRequest(reason="test"))
            )
            # The saga has the request. It must not finish while the publish is held: it gets
            # a few seconds to show it would (on the code before, the receipt came in ~1 s,
            # and the publish then put the forgotten user's context back).
            deadline = time.monotonic() + 60
            while not whole.done() and not (await status(handle)).forget_pending:
                assert time.monotonic() < deadline, "the forget never arrived"
                await asyncio.sleep(0.05)
            await asyncio.wait({whole}, timeout=4)
        finally:
            Store.gate.set()
            Store.gate = None
        assert (await asyncio.wait_for(one, timeout=60)).deleted == 1
        assert whole is not None
        receipt = await asyncio.wait_for(whole, timeout=60)
        assert receipt.fragments_deleted > 0
        assert await mw.read_model.get(user) is None, "the forgotten user's context is back"
        assert await mw.store.all_for_user(user) == []
        left = [k async for k in mw.read_model.redis.scan_iter(match=f"{mw.read_model.prefix}*")]
        # Only the user's forget epoch stays: one number, what refuses writes and messages from
        # before the forget (docs/PRIVACY.md).
        kept = epoch_key(mw.read_model.prefix, user).encode()
        assert not [k for k in left if user_key(user).encode() in k and k != kept], left
        assert await mw.read_model.redis.get(kept) == b"1"


# --- the contents of the latest rounds' fragments, kept by the user workflow ---------------


def _started_input(history: Any) -> UserMemoryInput:
    attrs = history.events[0].workflow_execution_started_event_attributes
    [inp] = pydantic_data_converter.payload_converter.from_payloads(
        list(attrs.input.payloads), [UserMemoryInput]
    )
    return inp  # type: ignore[no-any-return]


@pytest.mark.parametrize("shape", [BY_REFERENCE_SHAPE, STORED_WEIGHTS_SHAPE])
async def test_rounds_do_not_resend_fragments_the_user_workflow_keeps(
    shape: int,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The user workflow keeps the contents of what its latest rounds made (state `recent`):
    an earlier fragment that comes back among the first `top_k` is named by id only, and yet
    the workflow's own answer (a Redis miss) holds the whole selection, as Redis does."""
    from mnemoflow.workflows import user_rounds

    monkeypatch.setattr(user_rounds, "ROUND_SHAPE", shape)
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"recent-{uuid.uuid4().hex[:8]}"
        handle, rounds = await _drive(client, mw, user)
        came_back = 0
        before: set[str] = set()
        for i, record in enumerate(rounds):
            round_handle = client.get_workflow_handle(record.workflow_id, result_type=RoundResult)
            result = await round_handle.result()
            inp = _input((await round_handle.fetch_history()).events[0])
            own = {r.id for r in result.fragments}
            ranked = [full_id(user, r.id) for r in result.ranked or []]
            # Every round before this one completed: all of them are vouched for.
            assert inp.held_from_round == (rounds[0].round_no if i else 0), (i, inp)
            known = {full_id(user, k) for k in inp.known_fragments}
            assert not any(held_by_round(user, k, inp.held_from_round) for k in known)
            # Only what this round made travels with contents, published or not.
            sent = {f.id for f in result.context.fragments}
            assert sent == own & set(ranked), (i, sent, own)
            assert result.made is not None
            assert {f.id for f in result.made} == own - set(ranked)
            # Earlier fragments back in the selection that the last one did not have: named by
            # id only, and held whole all the same (below).
            came_back += len(set(ranked) - before - own)
            before = set(ranked)
            # Nothing said in earlier rounds is written into this round's history; its own
            # lines are (the search can find what it looks for).
            history = payloads_text(await round_handle.fetch_history())
            assert all(line in history for line in PARTS[i]), i
            for line in [line for part in PARTS[:i] for line in part]:
                assert line not in history, (i, line)
        assert came_back >= 1, "no earlier fragment came back to the top: nothing tested"
        # Redis and the workflow's own answer hold the same selection, every content whole.
        published = await mw.read_model.get(user)
        ids = await _whole(mw, user, published)
        held = await handle.query(UserMemoryWorkflow.context)
        assert [f.id for f in held.fragments] == ids
        stored = {f.id: f.content for f in await mw.store.get(user, ids)}
        assert all(f.content == stored[f.id] for f in held.fragments)
        if shape == STORED_WEIGHTS_SHAPE:
            assert await assert_replays(client, [handle.id], name="recent-user") == 1
            round_ids = [r.workflow_id for r in rounds]
            assert await assert_replays(client, round_ids, name="round-recent") == len(round_ids)


async def test_a_forgotten_fragment_leaves_the_kept_contents_and_the_next_run(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """Forgetting a fragment takes its contents out of what the user workflow keeps: the next
    run's input (continue-as-new) carries the other kept fragments and not that one, and the
    rounds after still leave out what is kept."""
    client = dev_env.client
    cap = 200
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"recent-forget-{uuid.uuid4().hex[:8]}"
        lines = [line for part in PARTS for line in part]
        turns = conversation("t", lines, time.time() - 3 * HOUR)
        handle = None
        for i in range(0, len(turns), 2):
            handle = await submit(
                client,
                mw.task_queue,
                user,
                turns[i : i + 2],
                urgent=True,
                config=CONFIG,
                max_history_events=cap,
            )
            await wait_status(
                handle, lambda s, end=i + 2: s.watermarks["t"].indexed >= end, what="round"
            )
        assert handle is not None
        assert (await status(handle)).continued == 0, "continued before the forget: raise cap"
        stored = await mw.store.all_for_user(user)
        [husky] = [f for f in stored if "three husky dogs" in f.content]
        assert (await _forget(handle, husky.id)).deleted == 1

        # More rounds until the workflow continues as new; every line distinct.
        things = ["bike chain", "garden hose", "oven door", "car tyre", "attic window", "piano"]
        fixes = ["oil", "a new washer", "a hinge", "air", "putty", "tuning", "two screws"]
        more = [
            f"Errand {n}: the {things[n % 6]} needs {fixes[n % 7]} before day {n + 3}."
            for n in range(40)
        ]
        position = len(turns)
        for n, line in enumerate(more):
            said = conversation("t", [line, f"Noted errand {n}."], time.time() - HOUR)
            part = [t.model_copy(update={"position": position + t.position}) for t in said]
            position += len(part)
            await submit(
                client,
                mw.task_queue,
                user,
                part,
                urgent=True,
                config=CONFIG,
                max_history_events=cap,
            )
            now = await wait_status(
                handle, lambda s, end=position: s.watermarks["t"].indexed >= end, what="round"
            )
            if now.continued:
                break
        assert now.continued >= 1, "no continue-as-new: nothing tested"
        # The latest run (a handle without a run id; visibility lists it only eventually).
        history = await client.get_workflow_handle(handle.id).fetch_history()
        assert history.events[
            0
        ].workflow_execution_started_event_attributes.continued_execution_run_id
        state = _started_input(history).state
        assert state is not None and state.recent_from > 0
        kept = {f.id: f.content for f in state.recent}
        text = payloads_text(history)
        assert husky.id not in kept and "three husky dogs" not in text
        assert any(c[-40:] in text for c in kept.values())  # what is kept is there to find
        # The other fragments of the first rounds are still kept, whole.
        alive = {f.id: f.content for f in await mw.store.all_for_user(user)}
        assert len(kept) >= 5 and all(alive[k] == c for k, c in kept.items())
