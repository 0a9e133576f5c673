"""Driving the user workflow from tests: signal-with-start, polling status with deadlines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import SubmitEvent, UserMemoryInput, UserStatus
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.models.turns import ChatTurn
from mnemoflow.workflows.user_memory import UserMemoryWorkflow

#: Workflow ids started per task queue, so a test's worker can terminate them on the way out
#: (on the shared time-skipping server, a workflow left with no worker stops time skipping).
STARTED: dict[str, set[str]] = {}


def conversation(thread: str, lines: list[str], t0: float, step: float = 35.0) -> list[ChatTurn]:
    """Alternating human/ai turns stamped `step` seconds apart from t0."""
    return [
        ChatTurn(
            thread_id=thread,
            position=i,
            role="human" if i % 2 == 0 else "ai",
            content=text,
            time=t0 + i * step,
        )
        for i, text in enumerate(lines)
    ]


async def submit(
    client: Client,
    task_queue: str,
    user_id: str,
    turns: list[ChatTurn],
    *,
    event_id: str | None = None,
    urgent: bool = False,
    config: MemoryConfig | None = None,
    max_history_events: int = 10_000,
) -> WorkflowHandle:
    """Signal-with-start the user's workflow with one event."""
    event = SubmitEvent(
        event_id=event_id or f"{turns[0].thread_id}:{turns[0].position}-{turns[-1].position}",
        turns=turns,
        urgent=urgent,
    )
    STARTED.setdefault(task_queue, set()).add(user_workflow_id(user_id))
    return await client.start_workflow(
        UserMemoryWorkflow.run,
        UserMemoryInput(
            user_id=user_id,
            config=config or MemoryConfig.from_vocation("customer service"),
            max_history_events=max_history_events,
        ),
        id=user_workflow_id(user_id),
        task_queue=task_queue,
        start_signal="submit",
        start_signal_args=[event],
    )


async def status(handle: WorkflowHandle) -> UserStatus:
    """The status query, bounded so a missing worker fails fast instead of hanging ~30 s."""
    return await handle.query(UserMemoryWorkflow.status, rpc_timeout=timedelta(seconds=10))


async def wait_status(
    handle: WorkflowHandle,
    predicate: Callable[[UserStatus], bool],
    *,
    env: WorkflowEnvironment | None = None,
    step_s: float = 5.0,
    deadline_s: float = 120.0,
    what: str = "condition",
) -> UserStatus:
    """Poll the status until predicate holds; on time-skipping, advance workflow time by step_s.

    The deadline is wall-clock, so a broken workflow fails the test instead of hanging it.
    """
    end = time.monotonic() + deadline_s
    current: UserStatus | None = None
    while True:
        try:
            current = await status(handle)
        except RPCError:
            # A query can time out while a worker is busy or the run is being replaced;
            # the deadline below still bounds the wait.
            current = None
        if current is not None and predicate(current):
            return current
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}; last status: {current}")
        if env is not None and env.supports_time_skipping:
            await env.sleep(step_s)
        else:
            await asyncio.sleep(0.05)


async def eventually(
    check: Callable[[], Awaitable[bool]], *, deadline_s: float = 30.0, what: str = "condition"
) -> None:
    """Poll an async check until it holds or the wall-clock deadline passes."""
    end = time.monotonic() + deadline_s
    while not await check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def rounds_done(
    client: Client,
    task_queue: str,
    user_id: str,
    parts: list[list[ChatTurn]],
    *,
    config: MemoryConfig | None = None,
) -> WorkflowHandle:
    """Hand each part over as one urgent event and wait until its round indexed it (thread of
    the parts' turns)."""
    handle = None
    for part in parts:
        handle = await submit(client, task_queue, user_id, part, urgent=True, config=config)
        thread, end = part[-1].thread_id, part[-1].position + 1

        def indexed(s: UserStatus, thread: str = thread, end: int = end) -> bool:
            return thread in s.watermarks and s.watermarks[thread].indexed >= end

        await wait_status(handle, indexed, deadline_s=60, what="round indexed")
    assert handle is not None
    return handle
