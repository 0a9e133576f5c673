"""The search corpus's version across a forget, on a real redis-server (README.md, "How memory
is chosen for a call"): the agent process's cached index must never outlive a forget."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from mnemoflow.activities.search_corpus import SearchCorpus
from mnemoflow.middleware.search import FragmentSearch
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.corpus import corpus_version_key
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.ids import fragment_id, user_key

NOW = time.time()
CFG = MemoryConfig()


async def version(redis: aioredis.Redis, prefix: str, user: str) -> int:
    raw = await redis.get(corpus_version_key(prefix, user))
    assert raw is not None, "no version key"
    return int(raw)


def frag(user: str, content: str) -> Fragment:
    """Round 1's first fragment: the same id before and after a forget (rounds count anew)."""
    return Fragment(
        id=fragment_id(user, 1, 0),
        user_id=user,
        theme="health",
        types=["fact"],
        content=content,
        created_at=NOW - 3600,
        reinforced_at=NOW - 3600,
        thread_id="t1",
        start_pos=0,
        end_pos=2,
    )


async def test_a_forgotten_fragment_never_comes_back_from_a_cached_index(
    redis_url: str, unique_name: str
) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    prefix = f"{unique_name}:"
    corpus = SearchCorpus(redis, prefix)
    search = FragmentSearch(redis, prefix)  # one agent process, its cache kept throughout
    user, query = "alice", "allergic mangoes allergy"
    try:
        await corpus.add([frag(user, "User: I am allergic to mangoes")], [[0.1, 0.2]])
        before = await search.search(user, query, CFG, NOW)
        assert [f.content for f in before] == ["User: I am allergic to mangoes"]
        first_life = await version(redis, prefix, user)

        await corpus.delete_user(user)  # forget
        left = [k async for k in redis.scan_iter(match=f"{prefix}*{user_key(user)}*")]
        assert left == [], "forget leaves corpus data behind"

        await corpus.add([frag(user, "User: my allergy test was negative")], [[0.1, 0.2]])
        second_life = await version(redis, prefix, user)
        after = await search.search(user, query, CFG, NOW)
        print(
            f"versions {first_life} -> {second_life}; "
            f"before forget {[f.content for f in before]}, after {[f.content for f in after]}"
        )
        assert second_life > first_life, "a version repeated across the forget"
        assert [f.content for f in after] == ["User: my allergy test was negative"]
    finally:
        await redis.aclose()


async def test_every_change_moves_the_version_up(redis_url: str, unique_name: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    prefix = f"{unique_name}:"
    corpus = SearchCorpus(redis, prefix)
    user = "bob"
    try:
        seen: list[int] = []
        for step in range(3):
            await corpus.add([frag(user, f"User: fact {step}")], [[0.1, 0.2]])
            seen.append(await version(redis, prefix, user))
            await corpus.remove(user, [fragment_id(user, 1, 0)])
            seen.append(await version(redis, prefix, user))
            await corpus.delete_user(user)
            assert not await corpus.exists(user)
        print("versions:", seen)
        assert seen == sorted(set(seen)), "versions must only grow, across deletes too"
        assert seen[0] > 10**15, "a new counter starts at the server's time in microseconds"
    finally:
        await redis.aclose()


async def test_the_first_pass_fills_the_budget_as_the_model_call_packs_it(
    redis_url: str, unique_name: str
) -> None:
    """The search started early gets the published profile and the fragments expected in the
    window: none of those is in what it returns, and the profile's room is left free, so the
    model call's packing keeps all of it without asking the search again."""
    from mnemoflow.memory.prompt import in_window, memory_tokens
    from mnemoflow.memory.search import choose_fragments
    from mnemoflow.models.contracts import InjectedContext
    from mnemoflow.models.profile import UserProfile

    redis = aioredis.Redis.from_url(redis_url)
    prefix = f"{unique_name}:"
    corpus = SearchCorpus(redis, prefix)
    search = FragmentSearch(redis, prefix)
    user = "carol"
    old = [
        frag(user, f"User: my {i}th trip went to Lisbon {i} times with mango ice cream").model_copy(
            update={"id": fragment_id(user, 2 + i, 0), "thread_id": "t0", "created_at": NOW - 9e5}
        )
        for i in range(40)
    ]
    recent = [
        f.model_copy(
            update={"id": fragment_id(user, 90 + n, 0), "thread_id": "t9", "created_at": NOW}
        )
        for n, f in enumerate(old[:10])
    ]
    profile = UserProfile(name="Carol", constraints=["allergic to mango"] * 3)
    try:
        await corpus.add([*old, *recent], [[0.1, 0.2]] * 50)

        def visible(fragment: ContextFragment) -> bool:
            return in_window(fragment, "t9", NOW - 10)

        found = await search.search(
            user, "mango trip Lisbon", CFG, NOW, profile=profile, exclude=visible
        )
        assert found and not any(f.thread_id == "t9" for f in found)
        context = InjectedContext(user_id=user, version=1, generated_at=NOW, profile=profile)
        chosen = choose_fragments(found, context, "t9", NOW - 10, "mango trip Lisbon", CFG)
        assert [f.id for f in chosen] == [f.id for f in found]  # nothing to refill
        assert memory_tokens(profile, chosen) <= CFG.memory_budget_tokens
    finally:
        await redis.aclose()
