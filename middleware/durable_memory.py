"""DurableMemoryMiddleware: long-term memory for a LangChain v1 agent, memory work off the turn.

Mounted as `create_agent(model, tools, middleware=[DurableMemoryMiddleware(client=...)],
checkpointer=...)`. It declares its own state schema, so the positions it records survive in the
checkpointer (the predecessor wrote to undeclared channels, and LangGraph silently dropped them).

Per turn (docs/ARCHITECTURE.md, "Triggers", "Message identity", "Delivery"):
- before the agent: resolve the user id (a clear ValueError without one), stamp new messages
  with their time and owner, hand the user's messages not yet accepted to the client's outbox
  (held until the turn ends), and record in state which of them the workflow accepted;
- every model call: one read of the injected context (never raises, never waits for a round);
  the search of all of the user's fragments for the latest human message (started before the
  agent, awaited with a deadline; on timeout or failure the published fragments are used);
  trim the request below the thread's indexed watermark when the window reached its budget;
  rewrite the system prompt as core -> profile -> fragments, packed into the memory budget;
  after a call whose answer drew on injected fragments, signal those ids in the background;
  count the tokens the response reports (Prometheus, and the user's ledger with the next
  hand-over: middleware/chat_usage.py); the reply is given an id and captured at once;
- every tool call: its result is given an id and captured at once (other middleware may
  rewrite the list before the turn ends: summaries replace messages); after the forget tool
  (`middleware/tools.py`), the user's searches and cached reads are dropped and the forgotten
  ids are left out for the rest of the turn;
- after the agent: stamp what the turn added and release everything captured to the outbox,
  which delivers it in the background and retries until it is accepted (the turn never awaits
  it). Messages are known by identity, never by position; summaries other middleware writes
  and messages another user's turns added to a shared thread are not this user's memory.
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
from langchain_core.messages import AnyMessage, BaseMessage, SystemMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command

from mnemoflow.memory.prompt import assemble_system_prompt, in_window
from mnemoflow.memory.rerank import drawn_on
from mnemoflow.memory.search import choose_fragments
from mnemoflow.middleware.chat_usage import ChatTokenMetrics, PendingUsage, response_usage
from mnemoflow.middleware.client import MemoryClient
from mnemoflow.middleware.search import PendingSearches
from mnemoflow.middleware.tools import forgotten_by
from mnemoflow.middleware.window import (
    EPOCH_KEY,
    IDENTITY_KEY,
    OWNER_KEY,
    QUOTES_KEY,
    TIME_KEY,
    TURN_KEY,
    fresh_identity,
    handover_trigger,
    is_unkept,
    last_human_position,
    legacy_identity,
    message_identity,
    message_text,
    message_time,
    next_stamp,
    owned_by,
    owner_of,
    quoted_fragments,
    resolve_thread_id,
    resolve_user_id,
    stamp_messages,
    to_turns,
    window_from,
    window_start,
)
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment, InjectedContext
from mnemoflow.models.corpus import forgotten_since
from mnemoflow.models.profile import UserProfile

log = logging.getLogger(__name__)

#: Per-(user, thread) bookkeeping kept in process is bounded to this many entries.
MAX_TRACKED_THREADS = 10_000


SYNC_RUN_MESSAGE = (
    "DurableMemoryMiddleware is async-only (its memory client runs on an event loop): run the "
    "agent with `await agent.ainvoke(...)`, `agent.astream(...)` or `agent.abatch(...)`, not "
    "invoke/stream/batch"
)


class SyncRunError(TypeError):
    """A sync invoke/stream/batch of an agent with the middleware (it is async-only)."""


#: state key -> what is accepted ({"upto": identity, "more": [identities]}; a position count in
#: checkpoints written before message identities).
Accepted = dict[str, Any]


def merge_accepted(left: Accepted | None, right: Accepted | None) -> Accepted:
    """Reducer of `memory_accepted`: a new record replaces the key's value (the writer computed
    it from the current messages); an old position count keeps the highest."""
    merged = dict(left or {})
    for key, value in (right or {}).items():
        if isinstance(value, dict | list):
            merged[key] = value
        elif isinstance(merged.get(key), int | None):
            merged[key] = max(int(merged.get(key) or 0), int(value))
    return merged


def accepted_key(user_id: str, thread: str) -> str:
    """The `memory_accepted` key of a (user, thread): users sharing a thread id stay apart."""
    return f"{owner_of(user_id)}:{thread}"


class DurableMemoryState(AgentState[Any]):
    """The agent state plus what the middleware needs to keep across turns."""

    user_id: NotRequired[str]
    memory_accepted: NotRequired[Annotated[Accepted, OmitFromInput, merge_accepted]]


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
        remember: bool = True,
    ) -> None:
        """`core_prompt` None keeps the request's own system message as the core prompt;
        `metrics` None counts chat tokens in a registry of its own (`self.metrics.registry`).
        `remember` False makes a read-only memory: each model call gets the user's memory as
        usual, but nothing of the turn is handed over and nothing injected is reinforced (an
        evaluation harness probing memory, a turn the user asked not to keep). Its messages
        are marked (`window.UNKEPT_KEY`): a later turn of a middleware that remembers, on the
        same thread, or a `resync` of it, does not hand them over either. The explicit memory
        tools still act when called."""
        super().__init__()
        if not isinstance(client, MemoryClient):
            raise TypeError("client must be a middleware.MemoryClient")
        if core_prompt is not None and not isinstance(core_prompt, str):
            raise TypeError("core_prompt must be a string or None")
        if not isinstance(remember, bool):
            raise TypeError("remember must be True or False")
        self.client = client
        self.core_prompt = core_prompt
        self.remember = remember
        self.config = config or client.config
        self._clock = clock
        self.metrics = metrics or ChatTokenMetrics()
        # Chat tokens per (user, thread) that the next hand-over carries to the ledger.
        self._chat_usage = PendingUsage()
        self._tasks: set[asyncio.Task[Any]] = set()
        # First position the model saw on the last call, for the ceiling check after the turn.
        self._window: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._searches = PendingSearches(MAX_TRACKED_THREADS)
        # Fragment ids a memory tool forgot during a user's turn: never injected again in it.
        self._forgotten: OrderedDict[str, set[str]] = OrderedDict()
        # The profile each user's last model call injected: the next turn's early search fills
        # the budget next to it (no second read of the read model).
        self._profiles: OrderedDict[str, UserProfile] = OrderedDict()
        # The forget epoch each running turn started under (docs/ARCHITECTURE.md, "Forget
        # epochs"): every message new in the turn is stamped with it.
        self._turn_epochs: OrderedDict[tuple[str, str], int | None] = OrderedDict()

    # --- hooks ----------------------------------------------------------------------------

    async def abefore_agent(
        self, state: DurableMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Check the user id, stamp new input, capture what is not accepted yet."""
        user_id = resolve_user_id(state, runtime.context)
        thread = resolve_thread_id(runtime)
        # Read before anything of the turn is stamped: a line said after a forget (in any
        # process) carries the epoch after it, whatever the clocks say.
        epoch = await self.client.forget_epoch(user_id)
        self._turn_epochs[(user_id, thread)] = epoch
        self._turn_epochs.move_to_end((user_id, thread))
        while len(self._turn_epochs) > MAX_TRACKED_THREADS:
            self._turn_epochs.popitem(last=False)
        messages, update = self._stamped(state, user_id, epoch)
        if self.remember:
            known = self._known_accepted(state, user_id, thread, messages)
            self._offer(user_id, thread, messages, known)
            update.update(self._accepted_update(state, user_id, thread, messages, known))
        query = _latest_human_text(messages)
        if query.strip():  # as early as the turn allows: the model call awaits it
            # Fragments of this thread said since its oldest message are likely still in the
            # model's window: the search leaves them out of the budget from the start.
            since = window_from(messages, 0)
            self._searches.start(
                (user_id, thread), query, self._search_for(user_id, query, thread, since)
            )
        return update or None

    async def aafter_agent(
        self, state: DurableMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Stamp the turn's messages and release everything not accepted yet to the outbox,
        which delivers it in the background (never awaited by the turn)."""
        user_id = resolve_user_id(state, runtime.context)
        thread = resolve_thread_id(runtime)
        key = (user_id, thread)
        self._searches.forget(key)
        self._forgotten.pop(user_id, None)
        epoch = self._turn_epochs.pop(key, None)
        messages, update = self._stamped(state, user_id, epoch)
        if not self.remember:  # read-only: stamped (ids, times), never handed over
            self._window.pop(key, None)
            return update or None
        known = self._known_accepted(state, user_id, thread, messages)
        self._offer(user_id, thread, messages, known)
        seen = messages[self._window.get(key, 0) :]
        urgent, trigger = handover_trigger(seen, self.config)
        self.client.release(
            user_id, thread, urgent=urgent, trigger=trigger, chat_usage=self._chat_usage.take(key)
        )
        update.update(self._accepted_update(state, user_id, thread, messages, known))
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
        context, version = await self.client.context_at(user_id)
        if context is not None:
            self._profiles[user_id] = context.profile
            self._profiles.move_to_end(user_id)
            while len(self._profiles) > MAX_TRACKED_THREADS:
                self._profiles.popitem(last=False)
        found = None
        if query.strip():
            found = await self._search_result(user_id, thread, query, version)
        gone = self._forgotten.get(user_id)
        if gone:  # a tool forgot them earlier in this turn (the stores may lag a moment)
            found = None if found is None else [f for f in found if f.id not in gone]
            if context is not None:
                kept = [f for f in context.fragments if f.id not in gone]
                context = context.model_copy(update={"fragments": kept})

        indexed = self._indexed_prefix(state, user_id, thread, history, context)
        start = window_start(history, indexed, self.config)
        self._remember_window(user_id, thread, start)
        profile = context.profile if context is not None else UserProfile()
        since = window_from(history, start)
        fragments = choose_fragments(found, context, thread, since, query, self.config)

        overrides: dict[str, Any] = {}
        if start > 0:
            positions = {m.id: i for i, m in enumerate(history) if m.id is not None}
            overrides["messages"] = [
                m for m in request.messages if m.id is None or positions.get(m.id, start) >= start
            ]
        current = message_text(request.system_message) if request.system_message else ""
        core = self.core_prompt if self.core_prompt is not None else current
        prompt = assemble_system_prompt(core, profile, fragments, self.config.memory_budget_tokens)
        if prompt != current or (prompt and request.system_message is None):
            overrides["system_message"] = SystemMessage(content=prompt) if prompt else None
        response = await handler(request.override(**overrides) if overrides else request)
        if not self.remember:
            return response
        replies = list(getattr(response, "result", None) or [])
        self._capture(user_id, thread, replies, history, fragments)
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

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Capture the tool's result as soon as it exists (given an id if it has none); after a
        memory tool forgot something, drop what the turn found before, so the turn's next model
        call cannot inject it."""
        result = await handler(request)
        if isinstance(result, ToolMessage):
            try:
                user_id = resolve_user_id(request.state or {}, request.runtime.context)
                thread = resolve_thread_id(request.runtime)
            except Exception:
                return result
            forgotten = forgotten_by(result)
            if forgotten is not None:
                self._after_forget(user_id, forgotten)
            if self.remember:
                state = request.state if isinstance(request.state, dict) else {}
                self._capture(user_id, thread, [result], state.get("messages", ()))
        return result

    # --- sync entry points: the middleware is async-only ----------------------------------

    def before_agent(
        self, state: DurableMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Sync runs are not supported: the model call raises an error that names the fix.
        The input is stamped first (owner, time, identity: no I/O), so the failed turn's lines
        are stored with the user's next turn and never taken by another user of the thread."""
        user_id = resolve_user_id(state, runtime.context)
        _, update = self._stamped(state, user_id, self.client.known_epoch(user_id))
        return update or None

    def after_agent(
        self, state: DurableMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Sync runs are not supported: raise an error that names the fix."""
        raise SyncRunError(SYNC_RUN_MESSAGE)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        """Sync runs are not supported: raise an error that names the fix."""
        raise SyncRunError(SYNC_RUN_MESSAGE)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Sync runs are not supported: raise an error that names the fix."""
        raise SyncRunError(SYNC_RUN_MESSAGE)

    def _after_forget(self, user_id: str, fragment_ids: Sequence[str]) -> None:
        """Drop the user's searches and cached reads (they may hold the forgotten fragments) and
        leave those ids out for the rest of the turn; the next model call searches again."""
        self._searches.drop_user(user_id)
        self._profiles.pop(user_id, None)
        self.client.reader.drop(user_id)
        if self.client.searcher is not None:
            self.client.searcher.drop(user_id)
        self._forgotten.setdefault(user_id, set()).update(fragment_ids)
        self._forgotten.move_to_end(user_id)
        while len(self._forgotten) > MAX_TRACKED_THREADS:
            self._forgotten.popitem(last=False)

    # --- background work ------------------------------------------------------------------

    async def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for pending reinforcements and up to `timeout_s` for the client to deliver
        every hand-over; returns how many messages are still undelivered (they keep being
        retried in the background)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        return await self.client.flush(timeout_s)

    async def aclose(self) -> None:
        """Flush the background work (the MemoryClient belongs to the caller: close it too)."""
        await self.flush()

    def _capture(
        self,
        user_id: str,
        thread: str,
        messages: list[BaseMessage],
        before: Sequence[BaseMessage],
        injected: Sequence[ContextFragment] = (),
    ) -> None:
        """Give new messages an id, time and owner now, and hold them in the outbox until the
        turn ends: other middleware may rewrite the list before then. `before` is the list they
        follow: they sit at its end, and their time is never earlier than its stamps
        (window.next_stamp: a caller's clock ahead of this host's keeps replies after
        questions). Each is stamped with its turn (the identity of the latest human message:
        a forget that refuses it refuses them too) and with the words of `injected` fragments
        it quotes (cut out if such a fragment is forgotten before it is delivered;
        docs/ARCHITECTURE.md, "Invariants": forget)."""
        position = len(before)
        try:
            now = next_stamp(before, self._clock())
            owner = owner_of(user_id)
            epoch = self._turn_epochs.get((user_id, thread))
            asked = last_human_position(before)
            turn = message_identity(before[asked]) if asked is not None else None
            for message in messages:
                if message.id is None:
                    message.id = f"mf-{uuid.uuid4().hex}"
                if message_time(message) is None:
                    message.additional_kwargs[TIME_KEY] = now
                if not message.additional_kwargs.get(OWNER_KEY):
                    message.additional_kwargs[OWNER_KEY] = owner
                    message.additional_kwargs[IDENTITY_KEY] = fresh_identity(message)
                    if epoch is not None:
                        message.additional_kwargs.setdefault(EPOCH_KEY, epoch)
                if turn is not None and not message.additional_kwargs.get(TURN_KEY):
                    message.additional_kwargs[TURN_KEY] = turn
                quoted = quoted_fragments(message_text(message), injected)
                if quoted:
                    message.additional_kwargs[QUOTES_KEY] = quoted
            turns = [
                t.model_copy(update={"position": position + t.position})
                for t in to_turns(messages, thread, now, user_id)
            ]
            self.client.hand_over(user_id, turns, hold=True)
        except Exception as err:  # memory never fails a turn
            log.warning("memory capture failed (the turn went on): %r", err)

    def _stamped(
        self, state: DurableMemoryState, user_id: str, epoch: int | None
    ) -> tuple[list[AnyMessage], dict[str, Any]]:
        """The state's messages with time, owner and epoch stamps, and the update that stores
        them (`epoch`: the forget epoch of the turn, stamped on messages new to it)."""
        stamped = stamp_messages(
            state["messages"], self._clock(), owner_of(user_id), epoch, keep=self.remember
        )
        by_id = {m.id: m for m in stamped}
        messages = [by_id.get(m.id, m) for m in state["messages"]]
        return messages, ({"messages": stamped} if stamped else {})

    def _known_accepted(
        self, state: DurableMemoryState, user_id: str, thread: str, messages: Sequence[AnyMessage]
    ) -> set[str]:
        """Identities of `messages` known accepted: recorded in state, or seen by the client."""
        identities = [message_identity(m) for m in messages]
        # A record written before identities carried a digest names messages by their id.
        legacy = {legacy_identity(m): i for m, i in zip(messages, identities, strict=True)}
        recorded = state.get("memory_accepted", {})
        value = recorded.get(accepted_key(user_id, thread))
        if value is None:
            value = recorded.get(thread)  # a checkpoint from before identities: a count
        known: set[str] = set()
        if isinstance(value, int):
            known.update(identities[:value])
        elif isinstance(value, dict):  # {"upto": last of the accepted head, "more": the rest}
            upto = str(value.get("upto"))
            upto_at = upto if upto in identities else legacy.get(upto, upto)
            if upto_at in identities:
                known.update(identities[: identities.index(upto_at) + 1])
            known.update(legacy.get(str(i), str(i)) for i in value.get("more") or ())
        elif isinstance(value, list):
            known.update(legacy.get(str(i), str(i)) for i in value)
        known |= self.client.accepted(user_id, thread, identities)
        # Said in a read-only turn: never to be delivered, so as good as accepted (the record
        # stays a compact head over them).
        known.update(i for m, i in zip(messages, identities, strict=True) if is_unkept(m))
        return known & set(identities)

    def _offer(
        self, user_id: str, thread: str, messages: list[AnyMessage], known: set[str]
    ) -> None:
        """Hold the user's messages in the list that are not `known` accepted in the outbox
        (a failure is logged: memory never fails a turn)."""
        try:
            fresh = to_turns(messages, thread, self._clock(), user_id, skip=known)
            self.client.hand_over(user_id, fresh, hold=True)
        except Exception as err:
            log.warning("memory capture failed (the turn went on): %r", err)

    def _accepted_update(
        self,
        state: DurableMemoryState,
        user_id: str,
        thread: str,
        messages: list[AnyMessage],
        known: set[str],
    ) -> dict[str, Any]:
        """The `memory_accepted` update, when what is known accepted changed. Compact, so a
        long thread's checkpoints do not grow with it: the last message of the head of the
        list whose messages are all accepted (or not this user's memory), plus the accepted
        identities after it (usually none: messages are accepted in order)."""
        upto: str | None = None
        more: list[str] = []
        in_head = True
        mine = owned_by(messages, owner_of(user_id))
        for message, memory in zip(messages, mine, strict=True):
            identity = message_identity(message)
            if in_head and (identity in known or not memory):
                upto = identity
            else:
                in_head = False
                if identity in known:
                    more.append(identity)
        value = {"upto": upto, "more": more}
        key = accepted_key(user_id, thread)
        if value == state.get("memory_accepted", {}).get(key) or (upto is None and not more):
            return {}
        return {"memory_accepted": {key: value}}

    def _indexed_prefix(
        self,
        state: Any,
        user_id: str,
        thread: str,
        history: Sequence[AnyMessage],
        context: InjectedContext | None,
    ) -> int:
        """How many leading messages are indexed: accepted, and said before the oldest message
        still waiting for its round (a summary or another user's message ends the run)."""
        mark = context.watermarks.get(thread) if context is not None else None
        if mark is None:
            return 0
        known = self._known_accepted(state, user_id, thread, history)
        mine = owned_by(history, owner_of(user_id))
        count = 0
        for message, memory in zip(history, mine, strict=True):
            stamp = message_time(message)
            if (
                not memory
                or is_unkept(message)  # never in memory: the model must keep seeing it
                or message_identity(message) not in known
                or stamp is None
                or (mark.pending_since is not None and stamp >= mark.pending_since)
            ):
                break
            count += 1
        return count

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

    async def _search_result(
        self, user_id: str, thread: str, query: str, version: int | None
    ) -> list[ContextFragment] | None:
        """The turn's search for `query`, searched again (once) when the corpus version this
        model call just read says fragments were deleted since the one the search read
        (`models.corpus.forgotten_since`): a forget in any process, and what it took must not
        be injected once it has returned. A round's writes alone do not: what the search found
        is still stored. The new search reads the corpus after that version."""
        key = (user_id, thread)
        deadline = self.config.search_deadline_s
        found = await self._searches.result(key, query, deadline, self._search_for(user_id, query))
        read = None if found is None else _version_of(found)
        if read is not None and version is not None and forgotten_since(read, version):
            self._searches.forget(key)
            found = await self._searches.result(
                key, query, deadline, self._search_for(user_id, query)
            )
        return found

    def _search_for(
        self, user_id: str, query: str, thread: str = "", since: float | None = None
    ) -> Callable[[], Coroutine[Any, Any, list[ContextFragment] | None]]:
        """The search of all of the user's fragments for `query`, to run as a task; those of
        `thread` said at or after `since` are expected in the window and left out."""

        def visible(fragment: ContextFragment) -> bool:
            return in_window(fragment, thread, since)

        profile = self._profiles.get(user_id)

        async def work() -> list[ContextFragment] | None:
            exclude = visible if since is not None else None
            return await self.client.search(
                user_id, query, self._clock(), profile=profile, exclude=exclude
            )

        return work

    def _remember_window(self, user_id: str, thread: str, start: int) -> None:
        key = (user_id, thread)
        self._window[key] = start
        self._window.move_to_end(key)
        while len(self._window) > MAX_TRACKED_THREADS:
            self._window.popitem(last=False)


def _version_of(found: Sequence[ContextFragment]) -> int | None:
    """The corpus version a search read (`memory.search.Excerpts`), if it says."""
    version = getattr(found, "version", None)
    return version if isinstance(version, int) else None


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
