"""The hot path's read after a clean read-model miss (middleware/read_path.py), on a real
redis-server: the workflow is asked in the background, at most every MISS_REQUERY_S per user,
and its answer serves the later calls."""

from __future__ import annotations

import time

import pytest

from mnemoflow.middleware import read_path
from mnemoflow.middleware.read_path import ContextReader
from mnemoflow.models.contracts import ContextFragment, InjectedContext
from mnemoflow.models.ids import context_key, epoch_key
from tests.support.drive import eventually


class WorkflowAnswers:
    """The `context` query of a user's workflow (a callable by design), counting its calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, uid: str) -> InjectedContext:
        self.calls.append(uid)
        fragment = ContextFragment(id="f1", theme="t", types=["fact"], content="User: hi")
        return InjectedContext(user_id=uid, version=len(self.calls), fragments=[fragment])


async def test_a_clean_miss_is_served_by_the_background_answer_and_queries_are_throttled(
    redis_url: str, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = WorkflowAnswers()
    reader = ContextReader(redis_url, f"{unique_name}:", 0.5, answers)
    uid = "u1"
    try:
        assert await reader.context(uid) is None  # never waits: the query runs in the background
        served: list[InjectedContext | None] = []

        async def answered() -> bool:
            served.append(await reader.context(uid))
            return served[-1] is not None

        await eventually(answered, deadline_s=10, what="the background answer served")
        more = [await reader.context(uid) for _ in range(20)]
        print(
            f"calls {1 + len(served) + len(more)}, workflow queries {len(answers.calls)}, "
            f"served {sum(r is not None for r in served + more)}"
        )
        assert all(r is not None and r.version == 1 for r in more)
        assert answers.calls == [uid], "one query per MISS_REQUERY_S, not one per call"

        # Past MISS_REQUERY_S the answer is refreshed, still in the background.
        monkeypatch.setattr(read_path, "MISS_REQUERY_S", 0.2)
        started = time.monotonic()

        async def refreshed() -> bool:
            found = await reader.context(uid)
            return found is not None and found.version == 2

        await eventually(refreshed, deadline_s=10, what="a refreshed background answer")
        for _ in range(20):
            await reader.context(uid)
        elapsed = time.monotonic() - started
        assert 2 <= len(answers.calls) <= 2 + elapsed / 0.2

        reader.drop(uid)  # after a forget: the answer may hold a forgotten fragment
        assert await reader.context(uid) is None
    finally:
        await reader.aclose()


async def test_a_published_context_retires_the_background_answer(
    redis_url: str, unique_name: str
) -> None:
    answers = WorkflowAnswers()
    prefix = f"{unique_name}:"
    reader = ContextReader(redis_url, prefix, 0.5, answers)
    uid = "u2"
    try:
        await reader.context(uid)

        async def answered() -> bool:
            return await reader.context(uid) is not None

        await eventually(answered, deadline_s=10, what="the background answer served")
        assert reader.redis is not None
        published = InjectedContext(user_id=uid, version=7)
        await reader.redis.set(context_key(prefix, uid), published.model_dump_json())
        found = await reader.context(uid)
        assert found is not None and found.version == 7
        # The read model is gone again (a forget): the old answer is not served any more.
        await reader.redis.delete(context_key(prefix, uid))
        assert await reader.context(uid) is None
    finally:
        await reader.aclose()


async def test_a_background_answer_is_not_served_once_the_user_is_forgotten_anywhere(
    redis_url: str, unique_name: str
) -> None:
    """Another process forgets the user (the read model and the corpus version go): this
    process must not keep serving the workflow's earlier answer for MISS_REQUERY_S."""
    from mnemoflow.models.corpus import corpus_version_key

    answers = WorkflowAnswers()
    prefix = f"{unique_name}:"
    reader = ContextReader(redis_url, prefix, 0.5, answers)
    uid = "u3"
    assert reader.redis is not None
    version = corpus_version_key(prefix, uid)
    await reader.redis.set(version, "1700000000000001")
    try:
        await reader.context(uid)

        async def answered() -> bool:
            return await reader.context(uid) is not None

        await eventually(answered, deadline_s=10, what="the background answer served")
        assert all([await reader.context(uid) is not None for _ in range(5)])
        await reader.redis.delete(version)  # the forget, in another process
        assert [await reader.context(uid) for _ in range(5)] == [None] * 5
        assert answers.calls == [uid]  # still throttled: dropped, not re-asked on every call
        # The user speaks again and a round starts a new corpus: a new answer is asked for
        # and served, the old one never is.
        await reader.redis.set(version, "1700000000000999")
        assert await reader.context(uid) is None
    finally:
        await reader.aclose()


async def test_the_forget_epoch_is_read_per_turn_never_lowered_and_unknown_without_redis(
    redis_url: str, unique_name: str
) -> None:
    """docs/ARCHITECTURE.md, "Forget epochs": what a turn's messages are stamped with."""
    prefix = f"{unique_name}:"
    reader = ContextReader(redis_url, prefix, 0.5, WorkflowAnswers())
    try:
        # No key: never recorded, or lost with Redis; this process saw none: the workflow says
        # (never a guessed 0, which a forget's epoch would refuse), once per process.
        answers = reader._query
        assert isinstance(answers, WorkflowAnswers)
        assert await reader.forget_epoch("ana") == 0 and answers.calls == ["ana"]
        assert await reader.forget_epoch("ana") == 0 and answers.calls == ["ana"]
        assert reader.redis is not None
        await reader.redis.set(epoch_key(prefix, "ana"), 0)  # the workflow started: 0
        assert await reader.forget_epoch("ana") == 0
        await reader.redis.set(epoch_key(prefix, "ana"), 2)
        assert await reader.forget_epoch("ana") == 2
        await reader.redis.delete(epoch_key(prefix, "ana"))  # Redis lost it
        assert await reader.forget_epoch("ana") == 2  # what this process saw stays
    finally:
        await reader.aclose()
    down = ContextReader("redis://127.0.0.1:1/0", prefix, 0.2, WorkflowAnswers())
    try:
        assert await down.forget_epoch("ana") is None  # unknown: the turn goes unstamped
        down.saw_epoch("ana", 3)  # e.g. its own forget's receipt
        assert await down.forget_epoch("ana") == 3
    finally:
        await down.aclose()
    # Without Redis, the workflow's own answer says it; nothing when it cannot be asked.
    answers = WorkflowAnswers()
    without = ContextReader(None, prefix, 0.2, answers)
    without.saw_epoch("ana", 3)
    assert await without.forget_epoch("ana") == 0 and answers.calls == ["ana"]

    async def no_workflow(uid: str) -> InjectedContext:
        raise LookupError("no workflow")

    assert await ContextReader(None, prefix, 0.2, no_workflow).forget_epoch("ana") is None


async def test_a_new_users_no_workflow_answer_is_kept_until_redis_says_more(
    redis_url: str, unique_name: str
) -> None:
    """A new user's first turn asks the workflow (there is none: 0). The turns after it do not
    ask again while the key is still absent (the workflow that first turn started has not
    written it yet, and its query would wait for a worker); a forget's epoch, written to Redis
    first, is still read at once."""
    prefix = f"{unique_name}:"
    asked: list[str] = []

    async def no_workflow(uid: str) -> InjectedContext:
        asked.append(uid)
        raise LookupError("no workflow")

    reader = ContextReader(redis_url, prefix, 0.5, no_workflow)
    try:
        assert [await reader.forget_epoch("new") for _ in range(3)] == [0, 0, 0]
        assert asked == ["new"]
        assert reader.redis is not None
        await reader.redis.set(epoch_key(prefix, "new"), 1)  # a forget elsewhere
        assert await reader.forget_epoch("new") == 1 and asked == ["new"]
        assert await reader.forget_epoch("other") == 0 and asked == ["new", "other"]
    finally:
        await reader.aclose()
