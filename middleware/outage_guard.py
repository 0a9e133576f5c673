"""MemoryOutageGuard: a tool that failed because memory is down answers the model instead of
failing the turn.

mnemoflow's own memory tools catch memory errors themselves (middleware/tools.py). Tools written
against LangGraph's store, LangMem's among them, do not: MnemoflowStore raises
MemoryUnavailableError when memory does not answer in time (it never turns an outage into "not
found" or a lost write), and LangChain's ToolNode re-raises what a tool raised, so the agent's
turn would fail. Mounted on the agent, this middleware turns that one error, from any tool,
into a tool message; every other error goes on as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ToolCallRequest
from langchain_core.messages import ToolMessage
from langgraph.types import Command

from mnemoflow.models.errors import MemoryUnavailableError

log = logging.getLogger(__name__)

#: What the model is told. A write may still land (the user workflow finishes an update its
#: caller gave up on), so it is not told the write was lost.
OUTAGE_REPLY = (
    "Memory did not answer in time; anything being saved may still be saved. Carry on without "
    "memory for now."
)


class MemoryOutageGuard(AgentMiddleware[Any, Any]):
    """Answer a tool call that hit MemoryUnavailableError with a message; the turn goes on."""

    def _reply(self, request: ToolCallRequest, err: MemoryUnavailableError) -> ToolMessage:
        name = request.tool_call.get("name", "")
        log.warning("tool %s: memory unavailable, the turn goes on: %r", name, err)
        return ToolMessage(
            OUTAGE_REPLY, tool_call_id=request.tool_call.get("id") or "", name=name, status="error"
        )

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        try:
            return handler(request)
        except MemoryUnavailableError as err:
            return self._reply(request, err)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        try:
            return await handler(request)
        except MemoryUnavailableError as err:
            return self._reply(request, err)
