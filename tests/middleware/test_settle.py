"""MemoryClient.settle and the operator timeout, on the dev server with the real worker, Redis
and Milvus Lite; and the pure rule behind settle."""

from __future__ import annotations

import time
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.middleware import MemoryClient, MemoryNotSettledError
from mnemoflow.middleware.settle import Published, pending_work
from mnemoflow.models.contracts import RoundRecord, UserStatus, Watermark
from mnemoflow.models.errors import MemoryUnavailableError
from mnemoflow.models.usage import CostLedger
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.middleware.conftest import LiveMemory
from tests.support.drive import conversation

LINES = [
    "Hi, I'm Ada Lovelace, a data engineer.",
    "Welcome, Ada!",
    "My order number is 7734-221 and it is late.",
    "Sorry, I'll check.",
]


def status(**changes: object) -> UserStatus:
    """A settled status of one thread, with `changes` applied."""
    base = UserStatus(
        user_id="u",
        rounds_started=1,
        rounds_completed=1,
        rounds_failed=0,
        pending_turns=0,
        pending_events=0,
        watermarks={"t": Watermark(accepted=4, indexed=4)},
        induction_cursor=0,
        uninducted=2,
        inductions=0,
        tuned_themes=[],
        ledger=CostLedger(),
        rounds=[],
        last_error=None,
        continued=0,
    )
    return base.model_copy(update=changes)


def test_pending_work_names_each_unfinished_part() -> None:
    assert pending_work(status(), Published(latest=3, in_redis=3), inducted=False) == []
    assert pending_work(status(), Published(latest=3, checked=False), inducted=False) == []
    behind = status(watermarks={"t": Watermark(accepted=6, indexed=4)}, pending_turns=2)
    assert pending_work(behind, Published(3, 3), inducted=False) == [
        "thread 't' has 2 accepted messages not indexed (indexed 4 of 6)"
    ]
    running = RoundRecord(
        round_no=2, workflow_id="w", event_id="e", thread_id="t", start=4, end=6,
        trigger="handover",
    )  # fmt: skip
    busy = status(rounds=[running], pending_events=1, last_error="round 1 failed: x")
    assert pending_work(busy, Published(3, 2), inducted=True) == [
        "1 events not yet absorbed by the workflow",
        "round 2 running",
        "read model holds v2, the workflow's latest context is v3",
        "2 fragments not yet inducted into the profile",
        "last error: round 1 failed: x",
    ]
    assert pending_work(status(), Published(1, None), inducted=False) == [
        "read model holds nothing, the workflow's latest context is v1"
    ]
    assert pending_work(status(), Published(1, unreadable="TimeoutError()"), inducted=False) == [
        "read model not readable (TimeoutError())"
    ]


@pytest.mark.integration
async def test_settle_returns_once_indexed_and_published(
    dev_env: WorkflowEnvironment, live_memory: LiveMemory
) -> None:
    client, user = live_memory.client, live_memory.new_user("settle")
    assert await client.settle(user, 5) is None, "an unknown user has nothing pending"
    # Stamped three hours ago: the round is due at once with production gates.
    await client.submit(user, conversation("t", LINES, time.time() - 3 * 3600))
    settled = await client.settle(user, 90, inducted=True)
    assert settled is not None
    assert settled.watermarks["t"] == Watermark(accepted=4, indexed=4)
    assert settled.rounds_completed >= 1 and settled.uninducted == 0
    published = await live_memory.worker.read_model.get(user)
    handle = dev_env.client.get_workflow_handle_for(
        UserMemoryWorkflow.run, client.workflow_id(user)
    )
    latest = await handle.query(UserMemoryWorkflow.context)
    assert published is not None and published.version == latest.version >= 1
    assert published.watermarks["t"].indexed == 4
    assert "Ada" in published.profile.name
    assert published == await client.context(user), "the hot path reads it at once"


@pytest.mark.integration
async def test_settle_times_out_naming_what_is_pending(live_memory: LiveMemory) -> None:
    client, user = live_memory.client, live_memory.new_user("fresh")
    # Stamped now: the customer-service gate is 14.5 minutes away.
    await client.submit(user, conversation("t", LINES, time.time()))
    started = time.monotonic()
    with pytest.raises(MemoryNotSettledError) as caught:
        await client.settle(user, 1.5)
    assert isinstance(caught.value, TimeoutError)
    # Bounded by the timeout plus one query's worth (generous for a loaded machine).
    assert time.monotonic() - started < 1.5 + 15
    text = str(caught.value)
    assert "thread 't' has 4 accepted messages not indexed" in text
    assert "consolidate" in text
    after = await client.status(user)
    assert after is not None and after.watermarks["t"].accepted == 4, "nothing lost"


@pytest.mark.integration
async def test_operator_calls_have_their_own_timeout(
    dev_env: WorkflowEnvironment, redis_url: str
) -> None:
    """With no worker polling, a query waits for its timeout: status and profile get the
    operator's (3 s here), a turn's read gets the hot path's (0.5 s)."""
    client = MemoryClient(
        temporal=dev_env.client,
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
        redis=redis_url,
        query_timeout_s=0.5,
        operator_timeout_s=3.0,
    )
    user = f"idle-{uuid.uuid4().hex[:8]}"
    try:
        await client.submit(user, conversation("t", LINES[:2], time.time()))
        for call in (client.status, client.profile):
            started = time.monotonic()
            with pytest.raises(MemoryUnavailableError):
                await call(user)
            waited = time.monotonic() - started
            assert waited >= 2.5, f"{call.__name__} gave up after {waited:.1f} s, too early"
        started = time.monotonic()
        with pytest.raises(MemoryUnavailableError):
            await client.status(user, timeout_s=client.query_timeout_s)
        assert time.monotonic() - started < 2.5
        started = time.monotonic()
        with pytest.raises(MemoryNotSettledError, match="memory unreachable"):
            await client.settle(user, 1.0)
        assert time.monotonic() - started < 1.0 + 5
    finally:
        await dev_env.client.get_workflow_handle(client.workflow_id(user)).terminate("over")
        await client.aclose()
