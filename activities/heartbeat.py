"""Heartbeating while a long call runs, so a worker that dies mid-call is noticed in seconds.

The workflow gives these activities a heartbeat timeout (`workflows.options.STORE_HEARTBEAT`,
`LLM_HEARTBEAT`): when a worker is killed, Temporal retries the activity on another worker once
the heartbeats stop, instead of after the whole start-to-close timeout (two minutes for an LLM
call). The heartbeat runs beside the call, so it says "this worker lives", not "the call
progresses": a call that hangs on a live worker is still bounded by start-to-close.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio import activity

#: Seconds between heartbeats; well under the workflows' heartbeat timeouts (10 s).
HEARTBEAT_EVERY_S = 2.0


@asynccontextmanager
async def heartbeating(every_s: float = HEARTBEAT_EVERY_S) -> AsyncIterator[None]:
    """Heartbeat in the background while the block runs (no-op outside an activity)."""
    if not activity.in_activity():
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
