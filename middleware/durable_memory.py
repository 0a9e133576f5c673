"""DurableMemoryMiddleware: long-term memory for a LangChain v1 agent, memory work off the turn.

Mounted as `create_agent(model, tools, middleware=[DurableMemoryMiddleware(client=...)],
checkpointer=...)`. It declares its own state schema, so the positions it records survive in the
checkpointer (the predecessor wrote to undeclared channels, and LangGraph silently dropped them).

Per turn (docs/ARCHITECTURE.md, "Triggers"):
- before the agent: resolve the user id (a clear ValueError without one), stamp new messages,
  and record in state what earlier background hand-overs got accepted;
- every model call: one read of the injected context (never raises, never waits for a round);
  the search of all of the user's fragments for the latest human message (started before the
  agent, awaited with a deadline; on timeout or failure the published fragments are used);
  trim the request below the thread's indexed watermark when the window reached its budget;
  rewrite the system prompt as core -> profile -> fragments, packed into the memory budget;
  after a call whose answer drew on injected fragments, signal those ids in the background;
  count the tokens the response reports (Prometheus, and the user's ledger with the next
  hand-over: middleware/chat_usage.py);
- after the agent: stamp what the turn added and hand the messages after the accepted watermark
  over to the user's workflow as a background task (the turn never awaits it; the next turn
  re-sends whatever was not accepted). The graph state keeps every message.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    ModelResponse,
    OmitFromInput,
)
from langchain_core.messages import AnyMessage, SystemMessage
from langgraph.runtime import Runtime

from mnemoflow.memory.prompt import assemble_system_prompt
from mnemoflow.memory.rerank import drawn_on
from mnemoflow.memory.search import choose_fragments
from mnemoflow.middleware.chat_usage import ChatTokenMetrics, PendingUsage, response_usage
from mnemoflow.middleware.client import MemoryClient
from mnemoflow.middleware.search import PendingSearches
from mnemoflow.middleware.window import (
    handover_trigger,
    message_text,
    resolve_thread_id,
    resolve_user_id,
    stamp_messages,
    to_turns,
    window_start,
)
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment, Trigger
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn

log = logging.getLogger(__name__)

#: Per-(user, thread) bookkeeping kept in process is bounded to this many entries.
MAX_TRACKED_THREADS = 10_000


def merge_accepted(left: dict[str, int] | None, right: dict[str, int] | None) -> dict[str, int]:
    """Reducer of `memory_accepted`: per thread, the highest accepted position wins."""
    merged = dict(left or {})
    for thread, position in (right or {}).items():
        merged[thread] = max(merged.get(thread, 0), position)
    return merged


class DurableMemoryState(AgentState[Any]):
    """The agent state plus what the middleware needs to keep across turns."""

    user_id: NotRequired[str]
    memory_accepted: NotRequired[Annotated[dict[str, int], OmitFromInput, merge_accepted]]


class DurableMemoryMiddleware(AgentMiddleware[DurableMemoryState, Any, Any]):
    """Hands every turn to the user's memory workflow and injects the memory it prepared."""

    state_schema = DurableMemoryState

    def __init__(
        self,
        *,
        client: MemoryClient,
        core_prompt: str | None = None,
        config: MemoryConfig | None = None,
        clock: Callable[[], float] = time.time,
        metrics: ChatTokenMetrics | None = None,
    ) -> None:
        """`core_prompt` None keeps the request's own system message as the core prompt;
        `metrics` None counts chat tokens in a registry of its own (`self.metrics.registry`)."""
        super().__init__()
        if not isinstance(client, MemoryClient):
            raise TypeError("client must be a middleware.MemoryClient")
        if core_prompt is not None and not isinstance(core_prompt, str):
            raise TypeError("core_prompt must be a string or None")
        self.client = client
        self.core_prompt = core_prompt
        self.config = config or client.config
        self._clock = clock
        self.metrics = metrics or ChatTokenMetrics()
        # Chat tokens per (user, thread) that the next hand-over carries to the ledger.
        self._chat_usage = PendingUsage()
        self._tasks: set[asyncio.Task[Any]] = set()
        # Latest hand-over task and highest accepted position per (user, thread), in process.
        self._handovers: OrderedDict[tuple[str, str], asyncio.Task[int]] = OrderedDict()
        self._accepted: dict[tuple[str, str], int] = {}
        # First position the model saw on the last call, for the ceiling check after the turn.
        self._window: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._searches = PendingSearches(MAX_TRACKED_THREADS)

    # --- hooks ----------------------------------------------------------------------------

    async def abefore_agent(
        self, state: DurableMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Check the user id, stamp new input, record accepted hand-overs of earlier turns."""
        user_id = resolve_user_id(state, runtime.context)
        thread = resolve_thread_id(runtime)
        update: dict[str, Any] = {}
        stamped = stamp_messages(state["messages"], self._clock())
        if stamped:
            update["messages"] = stamped
        accepted = self._harvest(user_id, thread)
        if accepted > state.get("memory_accepted", {}).get(thread, 0):
            update["memory_accepted"] = {thread: accepted}
        query = _latest_human_text(state["messages"])
        if query.strip():  # as early as the turn allows: the model call awaits it
            self._searches.start((user_id, thread), query, self._search_for(user_id, query))
        return update or None

    async def aafter_agent(
        self, state: DurableMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Stamp the turn's messages and hand everything not yet accepted over, not awaited."""
        user_id = resolve_user_id(state, runtime.context)
        thread = resolve_thread_id(runtime)
        self._searches.forget((user_id, thread))
        now = self._clock()
        stamped = stamp_messages(state["messages"], now)
        by_id = {m.id: m for m in stamped}
        messages = [by_id.get(m.id, m) for m in state["messages"]]
        update: dict[str, Any] = {"messages": stamped} if stamped else {}
        known = state.get("memory_accepted", {}).get(thread, 0)
        accepted = max(known, self._harvest(user_id, thread))
        if accepted > known:
            update["memory_accepted"] = {thread: accepted}
        if len(messages) > accepted:
            seen = messages[self._window.get((user_id, thread), 0) :]
            urgent, trigger = handover_trigger(seen, self.config)
            turns = to_turns(messages, thread, accepted, now)
            self._schedule_handover(user_id, thread, turns, urgent, trigger)
        return update or None

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        """Inject the prepared memory, trim below the indexed watermark; memory never fails it."""
        state = request.state
        user_id = resolve_user_id(state, request.runtime.context)
        thread = resolve_thread_id(request.runtime)
        history: Sequence[AnyMessage] = state.get("messages", [])
        query = _latest_human_text(history)
        context = await self.client.context(user_id)
        found = None
        if query.strip():
            found = await self._searches.result(
                (user_id, thread),
                query,
                self.config.search_deadline_s,
                self._search_for(user_id, query),
            )

        indexed = 0
        if context is not None and thread in context.watermarks:
            indexed = context.watermarks[thread].indexed
        start = window_start(history, indexed, self.config)
        self._remember_window(user_id, thread, start)
        profile = context.profile if context is not None else UserProfile()
        fragments = choose_fragments(found, context, thread, start, query, self.config)

        overrides: dict[str, Any] = {}
        if start > 0:
            positions = {m.id: i for i, m in enumerate(history) if m.id is not None}
            overrides["messages"] = [
                m for m in request.messages if m.id is None or positions.get(m.id, start) >= start
            ]
        current = message_text(request.system_message) if request.system_message else ""
        core = self.core_prompt if self.core_prompt is not None else current
        prompt = assemble_system_prompt(core, profile, fragments)
        if prompt != current or (prompt and request.system_message is None):
            overrides["system_message"] = SystemMessage(content=prompt) if prompt else None
        response = await handler(request.override(**overrides) if overrides else request)
        usage = response_usage(response)
        if usage is not None:
            self.metrics.record(usage)
            self._chat_usage.add((user_id, thread), usage)

        used = drawn_on(_response_text(response), fragments) if fragments else []
        if used:  # evidence of use, not injection: an injected fragment must not lock itself in
            call_id = f"{thread[:200]}:{len(history)}:{uuid.uuid4().hex}"
            ids = [f.id for f in used]
            self._spawn(self.client.reinforce(user_id, call_id, ids), "reinforce")
        return response

    # --- background work ------------------------------------------------------------------

    async def flush(self) -> None:
        """Wait for every pending background hand-over and reinforcement (errors are logged)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Flush the background work (the MemoryClient belongs to the caller)."""
        await self.flush()

    def _schedule_handover(
        self, user_id: str, thread: str, turns: list[ChatTurn], urgent: bool, trigger: Trigger
    ) -> None:
        """Submit the turns after any earlier hand-over of this thread, skipping what it sent."""
        key = (user_id, thread)
        previous = self._handovers.get(key)
        usage = self._chat_usage.take(key)

        async def handover() -> int:
            if previous is not None:
                await asyncio.wait([previous])  # its failure is logged; we re-send its turns
            done = self._accepted.get(key, 0)
            todo = [t for t in turns if t.position >= done]
            if not todo:
                self._chat_usage.add(key, usage)  # the next hand-over carries it
                return done
            try:
                await self.client.submit(
                    user_id, todo, urgent=urgent, trigger=trigger, chat_usage=usage
                )
            except BaseException:
                self._chat_usage.add(key, usage)
                raise
            self._accepted[key] = max(self._accepted.get(key, 0), todo[-1].position + 1)
            return self._accepted.get(key, 0)

        self._handovers[key] = self._spawn(handover(), "hand-over")
        self._handovers.move_to_end(key)
        while len(self._handovers) > MAX_TRACKED_THREADS:
            old, _ = self._handovers.popitem(last=False)
            self._accepted.pop(old, None)

    def _harvest(self, user_id: str, thread: str) -> int:
        """Highest position accepted by Temporal in this process (0 if unknown); forgets
        finished bookkeeping once read, since the state then holds it."""
        key = (user_id, thread)
        accepted = self._accepted.get(key, 0)
        task = self._handovers.get(key)
        if task is not None and task.done():
            del self._handovers[key]
            self._accepted.pop(key, None)
        return accepted

    def _spawn(self, work: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        """Run work in the background, keeping a reference until it ends; failures are logged."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)

        def finished(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("memory %s failed (the turn went on): %r", what, t.exception())

        task.add_done_callback(finished)
        return task

    # --- helpers --------------------------------------------------------------------------

    def _search_for(
        self, user_id: str, query: str
    ) -> Callable[[], Coroutine[Any, Any, list[ContextFragment] | None]]:
        """The search of all of the user's fragments for `query`, to run as a task."""

        async def work() -> list[ContextFragment] | None:
            return await self.client.search(user_id, query, self._clock())

        return work

    def _remember_window(self, user_id: str, thread: str, start: int) -> None:
        key = (user_id, thread)
        self._window[key] = start
        self._window.move_to_end(key)
        while len(self._window) > MAX_TRACKED_THREADS:
            self._window.popitem(last=False)


def _response_text(response: Any) -> str:
    """The text of the model's reply (a ModelResponse holds a list of messages)."""
    messages = getattr(response, "result", None) or []
    return "\n".join(message_text(m) for m in messages if getattr(m, "type", "") == "ai")


def _latest_human_text(history: Sequence[AnyMessage]) -> str:
    """What the user just asked: the query the published fragments are re-ranked for."""
    for message in reversed(history):
        if message.type == "human":
            return message_text(message)
    return ""
