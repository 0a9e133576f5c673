"""The users' corpus versions and the removal of the fragment copies an older version kept, on
a real redis-server (README.md, "How memory is chosen for a call"); the first pass of the
per-call search, on Milvus Lite."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.search_corpus import SearchCorpus, drop_copies
from mnemoflow.middleware.milvus_search import MilvusSearch
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.corpus import (
    DELETE_STEP,
    corpus_key,
    corpus_version,
    corpus_version_key,
    forgotten_since,
)
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


async def test_copies_from_before_are_deleted_and_versions_kept(
    redis_url: str, unique_name: str
) -> None:
    """`drop_copies` deletes the fragment copies an older version kept in Redis (one hash per
    user), under this prefix only: the versions, the read model and another deployment's
    prefix stay. A forget deletes a copy left behind too."""
    redis = aioredis.Redis.from_url(redis_url)
    prefix, other = f"{unique_name}[x]:", f"{unique_name}-other:"
    corpus = SearchCorpus(redis, prefix)
    try:
        users = [f"user{i}" for i in range(1203)]  # more than one UNLINK batch
        async with redis.pipeline(transaction=False) as pipe:
            for user in users:
                pipe.hset(corpus_key(prefix, user), mapping={"f": f"copy of {user}"})
                pipe.hset(corpus_key(other, user), mapping={"f": f"copy of {user}"})
            await pipe.execute()
        await corpus.added([frag(u, "User: hi") for u in users[:5]])
        await redis.set(f"{prefix}ctx:{user_key('user0')}", "published")
        assert await drop_copies(redis, prefix) == len(users)
        left = {k.decode() async for k in redis.scan_iter(match=f"{unique_name}*")}
        assert not [k for k in left if k.startswith(f"{prefix}corpus:")]
        assert {corpus_version_key(prefix, u) for u in users[:5]} <= left
        assert f"{prefix}ctx:{user_key('user0')}" in left
        assert len([k for k in left if k.startswith(f"{other}corpus:")]) == len(users)
        assert await drop_copies(redis, prefix) == 0

        await redis.hset(corpus_key(prefix, "user9"), mapping={"f": "left behind"})  # type: ignore[misc]
        await corpus.delete_user("user9")
        assert not await redis.exists(corpus_key(prefix, "user9"))
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
            await corpus.added([frag(user, f"User: fact {step}")])
            seen.append(await version(redis, prefix, user))
            await corpus.remove(user, [fragment_id(user, 1, 0)])
            seen.append(await version(redis, prefix, user))
            await corpus.bump([user])
            seen.append(await version(redis, prefix, user))
            await corpus.delete_user(user)
            assert not await redis.exists(corpus_version_key(prefix, user))
        print("versions:", seen)
        assert seen == sorted(set(seen)), "versions must only grow, across deletes too"
        assert seen[0] > 1024 * 10**15, "a new counter starts at 1024 x the time in microseconds"
    finally:
        await redis.aclose()


async def test_a_reader_tells_a_forget_from_a_rounds_writes(
    redis_url: str, unique_name: str
) -> None:
    """Writes move the version by 1, deletes by DELETE_STEP: `forgotten_since` says yes for a
    delete or a forget of the user in between, never for writes alone."""
    redis = aioredis.Redis.from_url(redis_url)
    prefix = f"{unique_name}:"
    corpus = SearchCorpus(redis, prefix)
    user = "carol"
    try:
        await corpus.added([frag(user, "User: my locker is number 41")])
        read = await version(redis, prefix, user)
        for n in range(5):
            await corpus.added([frag(user, f"User: fact {n}")])
        writes = await version(redis, prefix, user)
        assert writes == read + 5
        assert not forgotten_since(read, writes)
        await corpus.remove(user, [fragment_id(user, 1, 0)])
        deleted = await version(redis, prefix, user)
        assert deleted == writes + DELETE_STEP
        assert forgotten_since(read, deleted) and forgotten_since(writes, deleted)
        await corpus.remove(user, [])  # nothing deleted: nothing moves
        assert await version(redis, prefix, user) == deleted
        await corpus.delete_user(user)
        assert forgotten_since(
            deleted, corpus_version(await redis.get(corpus_version_key(prefix, user)))
        )
        await corpus.added([frag(user, "User: a new start")])
        assert forgotten_since(deleted, await version(redis, prefix, user))
        assert forgotten_since(0, deleted) and not forgotten_since(deleted, deleted)
    finally:
        await redis.aclose()


async def test_the_first_pass_fills_the_budget_as_the_model_call_packs_it(
    milvus_uri: str, unique_name: str
) -> None:
    """The search started early gets the published profile and the fragments expected in the
    window: none of those is in what it returns, and the profile's room is left free, so the
    model call's packing keeps all of it without asking the search again."""
    from mnemoflow.memory.prompt import in_window, memory_tokens
    from mnemoflow.memory.search import choose_fragments
    from mnemoflow.models.contracts import InjectedContext
    from mnemoflow.models.profile import UserProfile

    store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name, lines=True)
    await store.ensure()
    search = MilvusSearch(milvus_uri, collection=unique_name)
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
        await store.upsert([*old, *recent])

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
        await search.close()
        await store.drop()
        name = store.lines_collection
        assert name is not None
        await store._run_write(lambda c: c.drop_collection(name))
        await store.close()
