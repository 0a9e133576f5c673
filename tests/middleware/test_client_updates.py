"""MemoryClient's updates against the failures the server reports around continue-as-new and
forget: an update aborted because the run closed under it is sent again (updates are
idempotent); a request the workflow refuses is a clear InvalidInputError."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from mnemoflow.middleware import MemoryClient
from mnemoflow.models.contracts import RememberResult
from mnemoflow.models.errors import InvalidInputError, MemoryUnavailableError


class FlakyHandle:
    """A workflow handle whose first updates fail as scripted, then succeed."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.calls: list[Any] = []

    async def execute_update(self, update: Any, request: Any, **kwargs: Any) -> Any:
        self.calls.append(request)
        if self.failures:
            raise self.failures.pop(0)
        return RememberResult(fragment_id=f"f-{request.event_id}")


def _client(dev_env: WorkflowEnvironment, handle: FlakyHandle, **options: Any) -> MemoryClient:
    memory = MemoryClient(temporal=dev_env.client, task_queue="tq-updates-unused", **options)
    memory._handle = lambda uid: handle  # type: ignore[method-assign]

    async def started(uid: str, **options: Any) -> None:
        return None

    memory._start = started  # type: ignore[method-assign]
    return memory


def _aborted() -> RPCError:
    return RPCError("workflow update was aborted", RPCStatusCode.ABORTED, b"")


async def test_an_update_aborted_by_continue_as_new_is_sent_again_to_the_new_run(
    dev_env: WorkflowEnvironment,
) -> None:
    not_ready = RPCError(
        "unexpected workflow task failure: WorkflowNotReadyFailure", RPCStatusCode.UNKNOWN, b""
    )
    handle = FlakyHandle([_aborted(), not_ready])
    memory = _client(dev_env, handle)
    try:
        result = await memory.remember("ada", "My locker code is 4471.", event_id="e-1")
    finally:
        await memory.aclose()
    assert result.fragment_id == "f-e-1"
    assert [r.event_id for r in handle.calls] == ["e-1", "e-1", "e-1"]  # one event, sent again


async def test_retries_end_at_the_update_timeout_and_other_failures_are_not_retried(
    dev_env: WorkflowEnvironment,
) -> None:
    handle = FlakyHandle([_aborted() for _ in range(100)])
    memory = _client(dev_env, handle, update_timeout_s=1.0)
    try:
        with pytest.raises(MemoryUnavailableError, match="aborted"):
            await memory.remember("ada", "My locker code is 4471.")
        unavailable = RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b"")
        once = FlakyHandle([unavailable])
        memory._handle = lambda uid: once  # type: ignore[method-assign]
        with pytest.raises(MemoryUnavailableError, match="connection refused"):
            await memory.remember("ada", "My locker code is 4471.")
        assert len(once.calls) == 1
    finally:
        await memory.aclose()
    assert 2 <= len(handle.calls) <= 12  # backed off, not hammered


async def test_a_refused_request_is_an_invalid_input_error(dev_env: WorkflowEnvironment) -> None:
    refused = WorkflowUpdateFailedError(
        ApplicationError("the user is being forgotten", type="InvalidInput", non_retryable=True)
    )
    memory = _client(dev_env, FlakyHandle([refused]))
    try:
        with pytest.raises(InvalidInputError, match="being forgotten"):
            await memory.remember("ada", "My locker code is 4471.")
    finally:
        await memory.aclose()


async def test_every_update_failure_is_invalid_input_or_memory_unavailable(
    dev_env: WorkflowEnvironment,
) -> None:
    """What the server or the workflow reports maps to the client's two errors: a validator's
    ValueError is bad input; an update that timed out, or that failed because a store activity
    gave up, is memory unavailable (never temporalio's own error types)."""
    validator = WorkflowUpdateFailedError(ApplicationError("no recent round", type="ValueError"))
    gave_up = WorkflowUpdateFailedError(
        ActivityError(
            "activity failed",
            scheduled_event_id=1,
            started_event_id=2,
            identity="w",
            activity_type="select",
            activity_id="1",
            retry_state=None,
        )
    )
    memory = _client(dev_env, FlakyHandle([validator, WorkflowUpdateRPCTimeoutOrCancelledError()]))
    try:
        with pytest.raises(InvalidInputError, match="no recent round"):
            await memory.remember("ada", "My locker code is 4471.")
        with pytest.raises(MemoryUnavailableError, match="did not answer"):
            await memory.remember("ada", "My locker code is 4471.")
        memory._handle = lambda uid: FlakyHandle([gave_up])  # type: ignore[method-assign]
        with pytest.raises(MemoryUnavailableError, match="activity failed"):
            await memory.recall("ada", "locker")
    finally:
        await memory.aclose()


class SilentHandle:
    """A workflow handle whose update never answers, whatever its rpc timeout (the SDK waits
    up to twice that: for the update to be accepted, then for its result)."""

    async def execute_update(self, update: Any, request: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()


async def test_the_update_timeout_bounds_the_whole_update(dev_env: WorkflowEnvironment) -> None:
    memory = _client(dev_env, FlakyHandle([]), update_timeout_s=0.5)
    memory._handle = lambda uid: SilentHandle()  # type: ignore[method-assign]
    try:
        t0 = time.monotonic()
        with pytest.raises(MemoryUnavailableError, match="did not answer"):
            await asyncio.wait_for(memory.recall("ada", "locker"), 5)
        assert time.monotonic() - t0 < 0.5 + 0.5
        t0 = time.monotonic()
        with pytest.raises(MemoryUnavailableError, match="did not answer"):
            await asyncio.wait_for(memory.forget_fragment("ada", "f-1", timeout_s=0.2), 5)
        assert time.monotonic() - t0 < 0.2 + 0.5
    finally:
        await memory.aclose()
