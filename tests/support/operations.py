"""Helpers for operator-view tests: breakable offline models and waiting on rounds."""

from __future__ import annotations

import time
from typing import Any

from temporalio.client import Client

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import MemoryClient
from mnemoflow.models.turns import ChatTurn
from tests.support.drive import conversation, eventually


class Forbidden(Exception):
    """What an openai-style client raises for HTTP 403: the request itself is rejected (a
    refusal of the turns, HTTP 400, would keep them verbatim instead of failing the round)."""

    status_code = 403


class BreakableModels(HeuristicMemoryModels):
    """Offline models whose slicer fails permanently while `broken`, or on marked text."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        if self.broken or any("FAIL-ME" in t.content for t in turns):
            raise Forbidden("slicer refuses this conversation (test)")
        return await super().slice(turns, max_fragments)


def turns(thread: str, lines: list[str]) -> list[ChatTurn]:
    """A conversation stamped three hours ago: every round is due at once."""
    return conversation(thread, lines, time.time() - 3 * 3600)


async def settled(client: MemoryClient, user: str, rounds: int) -> Any:
    box: dict[str, Any] = {}

    async def check() -> bool:
        box["s"] = await client.status(user)
        s = box["s"]
        return bool(s and s.rounds_completed + s.rounds_failed >= rounds and s.uninducted == 0)

    await eventually(check, deadline_s=60, what=f"{rounds} rounds settled")
    return box["s"]


async def visible(temporal: Client, query: str, n: int) -> list[Any]:
    found: list[Any] = []

    async def check() -> bool:
        found[:] = [w async for w in temporal.list_workflows(query)]
        return len(found) == n

    await eventually(check, deadline_s=30, what=f"{n} workflows for {query}")
    return found
