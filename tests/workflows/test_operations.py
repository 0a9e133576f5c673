"""Operators' view on the dev server: search-attribute queries, pseudonymous keys, retry_round."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from mnemoflow.middleware import MemoryClient
from mnemoflow.models import search_attributes as sa
from mnemoflow.ops.operations import list_rounds, rounds_query
from tests.support.memory_worker import memory_worker
from tests.support.operations import BreakableModels, settled, turns, visible
from tests.support.replay import assert_replays

UPSERT = EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES


def client_for(env: WorkflowEnvironment, task_queue: str, **kw: Any) -> MemoryClient:
    return MemoryClient(temporal=env.client, task_queue=task_queue, **kw)


async def test_queries_find_a_users_rounds_and_exactly_the_failed_ones(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=BreakableModels()
    ) as mw:
        client = client_for(dev_env, mw.task_queue, redis=redis_url)
        user = f'op "quoted" \\ {uuid.uuid4().hex[:6]}'
        mw.track(client.workflow_id(user))
        await client.submit(user, turns("good", ["My name is Olga.", "Hi Olga."]))
        await client.submit(user, turns("bad", ["FAIL-ME please", "ok"]))
        status = await settled(client, user, 2)
        assert status.rounds_completed == 1 and status.rounds_failed == 1

        key = client.search_user(user)  # quotes and backslashes cannot be queried: a hash
        assert key.startswith("sha256-")
        everything = await visible(dev_env.client, rounds_query(key), 2)
        failed = await visible(dev_env.client, rounds_query(key, failed_only=True), 1)
        assert {w.id for w in failed} < {w.id for w in everything}
        report = await list_rounds(dev_env.client, client, user, failed_only=True)
        [row] = report["rounds"]
        assert row["outcome"] == "failed" and row["event_id"] and "refuses" in row["error"]

        # The round that completed wrote no search attribute after its start (round shape 7):
        # no outcome, no theme, no upsert event. Its status says it completed, and the
        # report takes the theme from the user workflow's record of it.
        rows = {
            r["outcome"]: r for r in (await list_rounds(dev_env.client, client, user))["rounds"]
        }
        done = rows["completed"]
        assert done["status"] == "COMPLETED" and done["event_id"] != row["event_id"]
        [record] = [r for r in status.rounds if r.workflow_id == done["workflow_id"]]
        assert record.theme in sa.THEME_VOCABULARY and done["theme"] == record.theme
        done_id = done["workflow_id"]
        [execution] = await visible(dev_env.client, f'WorkflowId = "{done_id}"', 1)
        attrs = execution.typed_search_attributes
        assert attrs.get(sa.OUTCOME) is None and attrs.get(sa.THEME) is None
        assert attrs.get(sa.ROUND) == record.round_no
        ids = [done["workflow_id"], row["workflow_id"]]
        for workflow_id in ids:
            history = await dev_env.client.get_workflow_handle(workflow_id).fetch_history()
            upserts = [e for e in history.events if e.event_type == UPSERT]
            # The failed round records its outcome: the failed-rounds query above found it.
            assert len(upserts) == (workflow_id == row["workflow_id"]), workflow_id
        assert await assert_replays(dev_env.client, ids, name="round-quiet") == 2
        await client.aclose()


async def test_pseudonymous_keys_hide_the_raw_id_and_still_find_rounds(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=BreakableModels()
    ) as mw:
        client = client_for(
            dev_env, mw.task_queue, user_key_secret="operator-secret", pseudonymous_user_keys=True
        )
        user = f"pat.private@example.com-{uuid.uuid4().hex[:6]}"
        mw.track(client.workflow_id(user))
        await client.submit(user, turns("t", ["I'm Pat.", "Hello Pat."]))
        await settled(client, user, 1)
        key = client.search_user(user)
        assert user not in key and "pat" not in client.workflow_id(user)
        [round_run] = await visible(dev_env.client, rounds_query(key), 1)
        assert user not in round_run.id
        desc = await dev_env.client.get_workflow_handle(round_run.id).describe()
        assert user not in (await desc.static_summary() or "")
        assert [w async for w in dev_env.client.list_workflows(rounds_query(user))] == []
        await client.aclose()


async def test_retry_round_reruns_a_failed_round_once_and_it_succeeds(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    models = BreakableModels()
    models.broken = True
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        client = client_for(dev_env, mw.task_queue)
        user = f"rita-{uuid.uuid4().hex[:6]}"
        mw.track(client.workflow_id(user))
        await client.submit(user, turns("t", ["I'm Rita, order 5150.", "Got it."]))
        failed = await settled(client, user, 1)
        assert failed.rounds_failed == 1 and failed.pending_turns == 2
        event_id = failed.rounds[-1].event_id

        models.broken = False  # the bug is fixed; the operator retries
        result = await client.retry_round(user, event_id)
        assert result.scheduled and result.pending_turns == 2
        done = await settled(client, user, 2)
        assert done.rounds_completed == 1 and done.rounds_started == 2
        assert done.rounds[-1].trigger == "retry" and done.rounds[-1].status == "completed"
        assert done.watermarks["t"].indexed == 2 and done.pending_turns == 0
        with pytest.raises(ValueError, match="did not fail"):  # as retry_round's docstring says
            await client.retry_round(user, event_id)  # it succeeded: nothing left to retry
        assert await mw.store.count(user) == done.rounds[-1].fragments
        await client.aclose()
