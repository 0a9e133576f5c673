"""MemoryClient: the one client of a user's memory, shared by the middleware, tools, CLI and tests.

Every operation goes to the user's UserMemoryWorkflow (id from `models.ids.user_workflow_id`):
hand-overs by signal-with-start, reinforcement by signal, explicit operations by update. The hot
path's read (`context`) is one Redis GET of the read model, with the workflow's `context` query
as the fallback; it never raises, because an agent turn must go on when memory is down.

Errors: operations other than `context` raise `MemoryUnavailableError` when memory cannot
answer in time (Temporal unreachable, no worker polling, a store down so the workflow cannot
finish the request: every Temporal RPC or update failure of that kind), and ValueError for an
unusable user id or argument (`InvalidInputError`, a ValueError, for a bad argument or a request
the workflow refused), checked before any call to Temporal.

Timeouts: the hot path's (`query_timeout_s`, at most 2 s: a turn must not wait longer), the
operator's (`operator_timeout_s`, for scripts: `status`, `settle`), the updates'
(`update_timeout_s`, 60 s, for scripts) and the memory tools' (`tool_timeout_s`, 10 s: a tool
call inside a turn waits at most this long for its updates, then tells the model what it knows:
a forget the workflow accepted and has not finished yet is pending, not failed).

Delivery (docs/ARCHITECTURE.md, "Delivery"): the middleware hands messages to `hand_over`,
which never raises; the client's outbox (middleware/outbox.py) retries every hand-over in the
background until the user workflow accepted it. Use the client as
`async with MemoryClient(...) as memory:` or call `aclose()`: closing waits up to
`close_timeout_s` for what is still undelivered. A process that died before delivering re-sends
from its checkpointer with `resync`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aioredis
from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ValidationError
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from mnemoflow.middleware.long_turns import split_turn
from mnemoflow.middleware.outbox import (
    MAX_OUTBOX_BYTES,
    MAX_OUTBOX_MESSAGES,
    Outbox,
    OutboxMetrics,
)
from mnemoflow.middleware.payloads import split_event
from mnemoflow.middleware.read_path import ContextReader
from mnemoflow.middleware.settle import (
    SETTLE_POLL_S,
    MemoryNotSettledError,
    Published,
    pending_work,
)
from mnemoflow.middleware.window import to_turns
from mnemoflow.models import search_attributes as sa
from mnemoflow.models.config import FRAGMENT_TYPES, MemoryConfig, Vocation
from mnemoflow.models.contracts import (
    ConfigUpdate,
    ConsolidateRequest,
    ConsolidateResult,
    ContextFragment,
    ForgetFragmentRequest,
    ForgetFragmentResult,
    ForgetReceipt,
    ForgetRequest,
    InjectedContext,
    RecallRequest,
    RecallResult,
    ReinforceEvent,
    RememberRequest,
    RememberResult,
    ResyncResult,
    RetryRoundRequest,
    RetryRoundResult,
    ShredRequest,
    SubmitEvent,
    Trigger,
    UserMemoryInput,
    UserStatus,
)
from mnemoflow.models.errors import InvalidInputError, MemoryUnavailableError
from mnemoflow.models.ids import (
    pseudonymous_workflow_id,
    resolve_user_keys,
    search_user_value,
    thread_key,
    turns_event_id,
    user_workflow_id,
    validate_user_id,
)
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn, turn_identity
from mnemoflow.models.usage import LLMUsage, PriceTable
from mnemoflow.workflows.user_memory import UserMemoryWorkflow

if TYPE_CHECKING:
    from mnemoflow.middleware.milvus_search import MilvusSearch

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=BaseModel)

#: The hot path may wait at most this long for the query fallback (docs/ARCHITECTURE.md, one GET).
MAX_QUERY_TIMEOUT_S = 2.0
#: Longest text `remember` takes (RememberRequest's bound).
MAX_REMEMBER_CHARS = 8000
#: Deadline of each Milvus call of the per-call search: the model call stops waiting at its
#: search deadline anyway (0.25 s), this only frees the thread of a call that hangs.
SEARCH_CALL_TIMEOUT_S = 2.0
#: How long a memory tool inside a turn waits for its update by default (`tool_timeout_s`).
TOOL_TIMEOUT_S = 10.0
#: Failure types of an update the workflow refused as bad input: InvalidInputError's, and what
#: an update validator raising ValueError or TypeError turns into.
REFUSED_TYPES = frozenset({InvalidInputError.type, "ValueError", "TypeError"})


@dataclass(frozen=True)
class _Pending:
    """An update the workflow accepted and had not finished by the caller's deadline."""

    run_id: str | None


def check_timeout(name: str, value: Any) -> float:
    """A usable timeout in seconds (a finite number > 0); InvalidInputError naming `name`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidInputError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _seconds(timeout_s: float | None, default: float) -> float:
    """A call's `timeout_s` (checked), else the client's `default`."""
    return default if timeout_s is None else check_timeout("timeout_s", timeout_s)


def _request(model: type[_M], **fields: Any) -> _M:
    """Build an update's request; a field it refuses is an InvalidInputError naming the field
    (raised before any call to Temporal)."""
    try:
        return model(**fields)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or model.__name__}: {e['msg']}"
            for e in err.errors()
        )
        raise InvalidInputError(f"invalid argument ({problems})") from err


def _run_closed_under(err: RPCError) -> bool:
    """Whether the server aborted an update because its workflow run closed (continue-as-new)
    before the update was accepted; the next run takes it."""
    text = str(err).lower()
    return err.status == RPCStatusCode.ABORTED or any(
        mark in text for mark in ("update was aborted", "workflownotready", "workflow not ready")
    )


def _fragment_types(types: Any) -> list[str]:
    """The fragment types `remember` was given, checked (InvalidInputError naming the allowed
    ones): a list of known types, at least one; a str is refused, not split into letters."""
    allowed = ", ".join(FRAGMENT_TYPES)
    if isinstance(types, str) or not isinstance(types, Sequence):
        raise InvalidInputError(
            f"types must be a list of fragment types ({allowed}), got {types!r:.80}; "
            f'for one type write ["{types}"]'
            if isinstance(types, str)
            else f"types must be a list of fragment types ({allowed}), got {types!r:.80}"
        )
    unknown = [t for t in types if t not in FRAGMENT_TYPES]
    if unknown:
        raise InvalidInputError(f"unknown fragment types {unknown!r:.120}; allowed: {allowed}")
    if not types:
        raise InvalidInputError(f"types is empty: give at least one of {allowed}")
    return list(dict.fromkeys(types))


def _merged(receipts: Sequence[ForgetReceipt]) -> ForgetReceipt:
    """One receipt for the forgets of one user's workflows (the last one's, counts summed)."""
    last = receipts[-1]
    if len(receipts) == 1:
        return last
    summed = {
        name: sum(getattr(r, name) for r in receipts)
        for name in (
            "fragments_deleted",
            "read_model_deleted",
            "events_dropped",
            "rounds_cancelled",
            "keys_destroyed",
            "profile_facts_removed",
        )
    }
    fence = max(r.fence for r in receipts)
    return last.model_copy(update={**summed, "fence": fence, "workflows_forgotten": len(receipts)})


class MemoryClient:
    """Submit, read and manage one user's memory at a time, through Temporal and Redis."""

    def __init__(
        self,
        *,
        temporal: Client,
        task_queue: str,
        redis: aioredis.Redis | str | None = None,
        key_prefix: str = "mnemoflow:",
        config: MemoryConfig | None = None,
        prices: PriceTable | None = None,
        llm_task_queue: str | None = None,
        query_timeout_s: float = 2.0,
        redis_timeout_s: float = 0.5,
        signal_timeout_s: float = 10.0,
        update_timeout_s: float = 60.0,
        operator_timeout_s: float = 30.0,
        tool_timeout_s: float = TOOL_TIMEOUT_S,
        search_attributes: bool = True,
        user_key_secret: str | bytes | None = None,
        pseudonymous_user_keys: bool | None = None,
        embeddings: Embeddings | None = None,
        close_timeout_s: float = 10.0,
        max_outbox_messages: int = MAX_OUTBOX_MESSAGES,
        max_outbox_bytes: int = MAX_OUTBOX_BYTES,
        metrics_registry: Any = None,
        milvus_uri: str | None = None,
        milvus_token: str | None = None,
        milvus_collection: str = "mnemoflow_fragments",
    ) -> None:
        """`user_key_secret` turns on pseudonymous user keys: workflow ids and search attributes
        then carry hashes, never the raw user id (search attributes are not encrypted).
        `pseudonymous_user_keys` decides it as `MNEMOFLOW_PSEUDONYMOUS_USER_KEYS` does for the
        processes (`models.ids.resolve_user_keys`): unset, it is on when the Temporal client
        has a payload codec (encryption keys); on without a secret is a ValueError, and so is a
        secret without a codec while it is unset, so no client addresses the raw-id workflow of
        a user whose operator addresses the pseudonymous one (docs/PRIVACY.md).
        `embeddings` (the worker's model) embeds questions for the per-call search in this
        process; without it that search is lexical only (middleware.search).
        `close_timeout_s` bounds how long `aclose` waits for undelivered hand-overs;
        `tool_timeout_s` how long a memory tool inside a turn waits for memory (at most
        `update_timeout_s`);
        `metrics_registry` (a prometheus CollectorRegistry) receives the outbox gauges.
        `milvus_uri` (the workers' `MILVUS_URI`, with `milvus_token` and `milvus_collection`)
        is where the per-call search asks for its candidates (middleware.milvus_search): this
        process holds no user's fragments. Without it every model call injects the published
        context only. Redis serves the published context and the corpus version."""
        if not isinstance(temporal, Client):
            raise TypeError("temporal must be a temporalio.client.Client")
        converter = temporal.data_converter.payload_converter_class
        if not issubclass(converter, PydanticPayloadConverter):
            # Every contract is a pydantic model: the default converter would mangle them.
            raise ValueError(
                "the Temporal client must use temporalio.contrib.pydantic.pydantic_data_converter"
            )
        if not task_queue or not task_queue.strip():
            raise ValueError("task_queue is empty")
        if not 0 < query_timeout_s <= MAX_QUERY_TIMEOUT_S:
            raise ValueError(f"query_timeout_s must be in (0, {MAX_QUERY_TIMEOUT_S}]")
        for name, value in (
            ("redis_timeout_s", redis_timeout_s),
            ("signal_timeout_s", signal_timeout_s),
            ("update_timeout_s", update_timeout_s),
            ("operator_timeout_s", operator_timeout_s),
            ("tool_timeout_s", tool_timeout_s),
            ("close_timeout_s", close_timeout_s),
        ):
            check_timeout(name, value)
        self.temporal = temporal
        self.task_queue = task_queue
        self.key_prefix = key_prefix
        self.config = config or MemoryConfig()
        self.prices = prices or PriceTable()
        self.llm_task_queue = llm_task_queue
        self.query_timeout_s = query_timeout_s
        self.redis_timeout_s = redis_timeout_s
        self.signal_timeout_s = signal_timeout_s
        self.update_timeout_s = update_timeout_s
        self.operator_timeout_s = operator_timeout_s
        self.tool_timeout_s = min(tool_timeout_s, update_timeout_s)
        self.close_timeout_s = close_timeout_s
        self.outbox = Outbox(
            self._deliver,
            max_messages=max_outbox_messages,
            max_bytes=max_outbox_bytes,
            metrics=OutboxMetrics(metrics_registry),
        )
        self.search_attributes = search_attributes
        self._secret: bytes | None = resolve_user_keys(
            user_key_secret,
            pseudonymous_user_keys,
            encrypted=temporal.data_converter.payload_codec is not None,
        )
        self.reader = ContextReader(redis, key_prefix, redis_timeout_s, self._query_context)
        self.searcher: MilvusSearch | None = None
        if milvus_uri:
            # Imported here: a client without the per-call search does not load pymilvus.
            from mnemoflow.middleware.milvus_search import MilvusSearch

            self.searcher = MilvusSearch(
                milvus_uri,
                token=milvus_token,
                collection=milvus_collection,
                embeddings=embeddings,
                redis=self.reader.redis,
                key_prefix=key_prefix,
                timeout_s=max(redis_timeout_s, SEARCH_CALL_TIMEOUT_S),
            )

    # --- hand-over ------------------------------------------------------------------------

    def hand_over(self, user_id: str, turns: Sequence[ChatTurn], *, hold: bool = False) -> int:
        """Queue messages for delivery in the background, retried until accepted; never raises
        for an unreachable memory (ValueError for an unusable user id). Returns how many were
        new to the outbox; `hold` keeps them until `release` (a turn still in progress)."""
        uid = validate_user_id(user_id)
        return self.outbox.add(uid, turns, hold=hold)

    def release(
        self,
        user_id: str,
        thread_id: str,
        *,
        urgent: bool = False,
        trigger: Trigger = "handover",
        chat_usage: LLMUsage | None = None,
    ) -> None:
        """Deliver the thread's queued messages now, with the turn's trigger and chat tokens."""
        uid = validate_user_id(user_id)
        self.outbox.release(uid, thread_id, urgent=urgent, trigger=trigger, chat_usage=chat_usage)

    def accepted(self, user_id: str, thread_id: str, identities: Sequence[str]) -> set[str]:
        """Which of these message identities this client saw the workflow accept."""
        return self.outbox.accepted(validate_user_id(user_id), thread_id, identities)

    async def flush(self, timeout_s: float = 10.0) -> int:
        """Deliver everything queued, waiting up to `timeout_s`; returns how many messages are
        still undelivered (they stay queued and keep being retried)."""
        return await self.outbox.flush(check_timeout("timeout_s", timeout_s))

    async def resync(self, user_id: str, thread_id: str, messages: Sequence[Any]) -> ResyncResult:
        """Re-send a thread's messages (LangChain messages, e.g. from a checkpointer's state)
        after a process died before delivering them. Idempotent: the workflow accepts each
        message identity once, so messages it has are no-ops. Messages another user's turns
        stamped, summaries other middleware wrote, and messages of read-only turns
        (`DurableMemoryMiddleware(remember=False)`) are skipped. Copies without memory's
        stamps (an app's own database) are known by their id and text, as the middleware first
        knew them; one without a time stamp is refused by a user workflow that forgot its user
        (when it was said is unknown: `ResyncResult.unstamped` counts them). Raises
        MemoryUnavailableError when Temporal cannot be reached."""
        uid = validate_user_id(user_id)
        thread = thread_key(thread_id)
        turns = to_turns(messages, thread, time.time(), uid, resent=True)
        if turns:
            await self.submit(uid, turns, trigger="explicit")
        unstamped = sum(t.unstamped for t in turns)
        if unstamped:
            log.warning(
                "resync of thread %r: %d messages have no time stamp (additional_kwargs[%r]); "
                "if the user was forgotten they are refused, since when they were said is "
                "unknown (status: refused_after_forget)",
                thread[:60],
                unstamped,
                "time",
            )
        return ResyncResult(
            thread_id=thread,
            sent=len(turns),
            skipped=len(messages) - len(turns),
            unstamped=unstamped,
        )

    async def submit(
        self,
        user_id: str,
        turns: Sequence[ChatTurn],
        *,
        urgent: bool = False,
        trigger: Trigger = "handover",
        chat_usage: LLMUsage | None = None,
    ) -> str:
        """Hand turns of one thread to the user's workflow now; returns the (last) event id.
        Raises MemoryUnavailableError when Temporal cannot be reached (`hand_over` retries).

        Each message is accepted once by its identity (`models.turns.turn_identity`), so a
        re-send is a no-op. A human or AI message longer than `config.max_turn_chars` is sent
        whole as consecutive parts of at most that many characters, each its own identity
        (middleware/long_turns.py); only what is past `config.max_message_chars` is cut, with
        an error log and the `mnemoflow_handover_cut_*` counters. Tool and system turns are cut
        to `max_turn_chars`. The turns are split into several events when one would come near
        Temporal's payload limit.
        `chat_usage` (the chat model's tokens since the last hand-over) rides on the last event:
        it is in the ledger once all are in. With no turns, an event carries only the usage.
        """
        uid = validate_user_id(user_id)
        if not turns and chat_usage is None:
            raise ValueError("submit needs at least one turn")
        if len({t.thread_id for t in turns}) > 1:
            raise ValueError("submit takes the turns of one thread at a time")
        trimmed: list[ChatTurn] = []
        cuts: list[tuple[ChatTurn, int]] = []
        for turn in turns:
            parts, cut = split_turn(turn, self.config.max_turn_chars, self.config.max_message_chars)
            trimmed.extend(parts)
            if cut:
                cuts.append((turn, cut))
        thread = trimmed[0].thread_id if trimmed else ""
        chunks = list(split_event(trimmed)) or [[]]
        event_id = ""
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            event_id = turns_event_id(thread, [turn_identity(t) for t in chunk])
            event = SubmitEvent(
                event_id=event_id,
                turns=chunk,
                urgent=urgent,
                trigger=trigger,
                chat_usage=chat_usage if last else None,
            )
            await self._start(uid, start_signal="submit", start_signal_args=[event])
        for turn, cut in cuts:  # counted once the message is handed over, not per retry
            self.outbox.metrics.cut_messages.inc()
            self.outbox.metrics.cut_chars.inc(cut)
            log.error(
                "a %s message of %d characters in thread %r was handed over cut: its last %d "
                "characters are not in memory (MemoryConfig.max_message_chars=%d)",
                turn.role,
                len(turn.content),
                thread[:60],
                cut,
                self.config.max_message_chars,
            )
        return event_id

    async def _deliver(
        self,
        uid: str,
        turns: list[ChatTurn],
        urgent: bool,
        trigger: Trigger,
        chat_usage: LLMUsage | None,
    ) -> None:
        await self.submit(uid, turns, urgent=urgent, trigger=trigger, chat_usage=chat_usage)

    async def reinforce(self, user_id: str, call_id: str, fragment_ids: Sequence[str]) -> None:
        """Tell the workflow which fragments one model call used (applied once per call id)."""
        uid = validate_user_id(user_id)
        event = ReinforceEvent(call_id=call_id, fragment_ids=list(fragment_ids))
        try:
            await self._handle(uid).signal(
                UserMemoryWorkflow.reinforce, event, rpc_timeout=self._rpc(self.signal_timeout_s)
            )
        except (RPCError, RuntimeError) as err:  # RuntimeError: the lazy connect failed
            raise MemoryUnavailableError(f"reinforce failed: {err}") from err

    # --- reads ----------------------------------------------------------------------------

    async def context(self, user_id: str) -> InjectedContext | None:
        """The user's injected context: one Redis GET, else the workflow query, else None
        (middleware/read_path.py). Never raises: a missing or unreachable memory means a turn
        without memory."""
        try:
            uid = validate_user_id(user_id)
        except ValueError:
            return None
        return await self.reader.context(uid)

    async def context_at(self, user_id: str) -> tuple[InjectedContext | None, int | None]:
        """`context`, and the user's corpus version read with it (None: not read), to tell a
        search that read an older corpus (`Excerpts.version`) from a current one."""
        try:
            uid = validate_user_id(user_id)
        except ValueError:
            return None, None
        return await self.reader.context_at(uid)

    async def search(
        self,
        user_id: str,
        query: str,
        now: float,
        *,
        profile: UserProfile | None = None,
        exclude: Callable[[ContextFragment], bool] | None = None,
    ) -> list[ContextFragment] | None:
        """All of the user's fragments ranked for `query` (middleware.search); None when there
        is nothing to search (no Redis, or no corpus yet). Errors propagate: the caller bounds
        this with a deadline and falls back to the published context. The budget is filled
        next to `profile` (the one the caller will inject), without the fragments `exclude`
        names (those the caller expects in the model's window)."""
        uid = validate_user_id(user_id)
        if self.searcher is None:
            return None
        found = await self.searcher.search(
            uid, query, self.config, now, profile=profile, exclude=exclude
        )
        return found or None

    async def profile(self, user_id: str, *, timeout_s: float | None = None) -> UserProfile | None:
        """The stored profile (workflow query, else the read model); None if the user is unknown.
        The query waits up to `timeout_s` (default `operator_timeout_s`)."""
        uid = validate_user_id(user_id)
        seconds = _seconds(timeout_s, self.operator_timeout_s)
        try:
            return await self._query(uid, UserMemoryWorkflow.profile, seconds)
        except LookupError:
            return None
        except MemoryUnavailableError:
            cached = await self.reader.cached(uid)
            if cached is None:
                raise
            return cached.profile

    async def status(self, user_id: str, *, timeout_s: float | None = None) -> UserStatus | None:
        """The workflow's status query; None if the user has no memory workflow.

        Waits up to `timeout_s` (default `operator_timeout_s`); inside a turn pass the hot
        path's `query_timeout_s`."""
        uid = validate_user_id(user_id)
        seconds = _seconds(timeout_s, self.operator_timeout_s)
        try:
            status: UserStatus = await self._query(uid, UserMemoryWorkflow.status, seconds)
        except LookupError:
            return None
        status.undelivered = self.outbox.pending(uid)
        return status

    async def settle(
        self, user_id: str, timeout_s: float = 60.0, *, inducted: bool = False
    ) -> UserStatus | None:
        """Wait until the user's memory has caught up; return the status that shows it.

        Caught up: every accepted message indexed, nothing queued or running, and the read
        model holding the workflow's latest context (`middleware.settle`); with `inducted`,
        also every fragment in the profile. None for a user without a memory workflow.
        Raises MemoryNotSettledError (a TimeoutError naming what is still pending) after
        `timeout_s`; messages not yet mature wait for their round unless `consolidate`d.
        """
        uid = validate_user_id(user_id)
        check_timeout("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            # Each query gets what is left of the deadline (at least a short attempt).
            each = min(self.operator_timeout_s, max(0.2, deadline - time.monotonic()))
            try:
                status = await self._query(uid, UserMemoryWorkflow.status, each)
                status.undelivered = self.outbox.pending(uid)
                pending = pending_work(status, await self._published(uid, each), inducted=inducted)
            except LookupError:
                return None
            except MemoryUnavailableError as err:
                pending = [f"memory unreachable: {err}"]
            else:
                if not pending:
                    return status
            left = deadline - time.monotonic()
            if left <= 0:
                raise MemoryNotSettledError(uid, timeout_s, pending)
            await asyncio.sleep(min(SETTLE_POLL_S, left))

    # --- explicit operations (updates) ----------------------------------------------------

    async def remember(
        self,
        user_id: str,
        text: str,
        *,
        theme: str = "remembered",
        types: Sequence[str] = ("fact",),
        event_id: str | None = None,
        timeout_s: float | None = None,
    ) -> RememberResult:
        """Store `text` as an explicit fragment; pass `event_id` to make a retry store it once.

        `types` is a list of fragment types (`models.config.FRAGMENT_TYPES`: identity,
        decision, preference, fact, episode, chat), at least one; a str, an unknown type or an
        empty list is refused. InvalidInputError for a text that is not a str, empty, or over
        MAX_REMEMBER_CHARS (an explicit memory is one fact: it is never cut, the caller keeps
        the text and can split it). Waits up to `timeout_s` (default `update_timeout_s`); when
        that ends first the memory may still be stored: a retry with the same `event_id`
        stores it once."""
        uid = validate_user_id(user_id)
        seconds = self._update_seconds(timeout_s)
        if not isinstance(text, str):
            raise InvalidInputError(f"text to remember must be a str, got {type(text).__name__}")
        if not text.strip():
            raise InvalidInputError("nothing to remember: the text is empty")
        if len(text) > MAX_REMEMBER_CHARS:
            raise InvalidInputError(
                f"text to remember is {len(text)} characters; at most {MAX_REMEMBER_CHARS} "
                "(an explicit memory is one fact: remember its parts one by one)"
            )
        request = _request(
            RememberRequest,
            event_id=event_id or f"remember-{uuid.uuid4().hex}",
            content=text,
            theme=theme,
            types=_fragment_types(types),
        )
        deadline = time.monotonic() + seconds
        await self._start(uid, timeout_s=seconds)
        return await self._update(uid, UserMemoryWorkflow.remember, request, deadline=deadline)

    async def recall(
        self, user_id: str, query: str, top_k: int = 5, *, timeout_s: float | None = None
    ) -> RecallResult:
        """Score the user's fragments for `query`, best first (empty for an unknown user).
        InvalidInputError for an empty query or a `top_k` outside 1..50; waits up to
        `timeout_s` (default `update_timeout_s`)."""
        uid = validate_user_id(user_id)
        seconds = self._update_seconds(timeout_s)
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a str, got {type(query).__name__}")
        if not query.strip():
            raise InvalidInputError("recall needs a non-empty query")
        request = _request(RecallRequest, query=query[:4000], top_k=top_k)
        try:
            return await self._update(
                uid, UserMemoryWorkflow.recall, request, deadline=time.monotonic() + seconds
            )
        except LookupError:
            return RecallResult(fragments=[])

    async def forget_fragment(
        self,
        user_id: str,
        fragment_id: str,
        *,
        timeout_s: float | None = None,
        quotes: bool = False,
        update_id: str | None = None,
        deadline: float | None = None,
    ) -> ForgetFragmentResult:
        """Delete one of the user's fragments (0 deleted when it is not theirs); waits up to
        `timeout_s` (default `update_timeout_s`), or until `deadline` (a time.monotonic()
        value) when given. With `quotes`, its words are also cut out of the messages not stored
        yet and of the other conversation rows that quote them (the "remember this" line a
        remembered fact came from, a reply that read it back).

        With `update_id` the forget is sent under that id (sent again with it, it is the same
        forget) and a deadline that ends after the workflow accepted it but before it finished
        (a worker killed mid-forget: the forget completes once another worker takes the user
        workflow over) returns `pending=True` instead of raising; `forget_fragment_result`
        waits for the outcome. MemoryUnavailableError only when it was not even accepted."""
        uid = validate_user_id(user_id)
        seconds = self._update_seconds(timeout_s)
        request = _request(ForgetFragmentRequest, fragment_id=fragment_id, quotes=quotes)
        try:
            out = await self._update(
                uid,
                UserMemoryWorkflow.forget_fragment,
                request,
                deadline=deadline if deadline is not None else time.monotonic() + seconds,
                update_id=update_id,
            )
        except LookupError:
            return ForgetFragmentResult(deleted=0)
        if isinstance(out, _Pending):
            return ForgetFragmentResult(
                deleted=0, pending=True, update_id=update_id, run_id=out.run_id
            )
        return out  # type: ignore[no-any-return]

    async def forget_fragment_result(
        self, user_id: str, pending: ForgetFragmentResult, *, timeout_s: float | None = None
    ) -> ForgetFragmentResult:
        """The outcome of a forget that `forget_fragment` reported `pending`, waiting up to
        `timeout_s` (default `update_timeout_s`); MemoryUnavailableError when it has not
        finished by then (it still will)."""
        uid = validate_user_id(user_id)
        seconds = self._update_seconds(timeout_s)
        if pending.update_id is None:
            raise InvalidInputError("not a pending forget: it names no update")
        handle = self._handle(uid).get_update_handle_for(
            UserMemoryWorkflow.forget_fragment, pending.update_id, workflow_run_id=pending.run_id
        )
        try:
            return await asyncio.wait_for(
                handle.result(rpc_timeout=self._rpc(seconds)), timeout=seconds + 0.25
            )
        except WorkflowUpdateFailedError as err:
            raise MemoryUnavailableError(f"memory update failed: {err.cause or err}") from err
        except (WorkflowUpdateRPCTimeoutOrCancelledError, TimeoutError, RPCError) as err:
            raise MemoryUnavailableError(
                f"the forget {pending.update_id} has not finished within {seconds:.3g} s: {err!r}"
            ) from err

    async def forget(self, user_id: str, reason: str = "user request") -> ForgetReceipt:
        """Forget the user entirely (the workflow's forget saga); returns its receipt.
        InvalidInputError for a `reason` that is not a str of at most 500 characters.

        A user id without a memory workflow gets one: the stores may still hold data under
        that id (a workflow terminated or reset by an operator), and only the workflow's saga
        deletes it. Like every user workflow it then stays, idle on a durable timer (the
        workflow never ends itself; ending it from here could lose a hand-over that arrives
        between the receipt and the end).

        The user's workflow under the other id form (readable when this client's keys are
        pseudonymous, or the reverse: made by a client configured otherwise, before clients
        refused that) is forgotten too when it runs: its state would otherwise outlive the
        forget and still be served. When it is the only one, it is the user's memory and is
        forgotten in place; when both run, the other is forgotten first and then terminated.
        The receipt sums their counts (`workflows_forgotten`)."""
        uid = validate_user_id(user_id)
        request = _request(ForgetRequest, reason=reason)
        primary = self.workflow_id(uid)
        others = {user_workflow_id(uid), pseudonymous_workflow_id(uid)} - {primary}
        running = [other for other in sorted(others) if await self._running(other)]
        if running and not await self._running(primary):
            # The user's memory lives only under the other form: forget it there, and start
            # no second workflow (an empty one would only hide where the memory is).
            receipt = _merged([await self._forget_in(uid, request, w) for w in running])
            self.reader.saw_epoch(uid, receipt.epoch)
            return receipt
        receipts: list[ForgetReceipt] = []
        for other in running:
            # Both forms ran: the other one is forgotten without its keys, which both forms
            # share and the primary's forget retires and destroys next; then it ends, so no
            # run of it ever needs the destroyed keys.
            keep = request.model_copy(update={"keys": False})
            receipts.append(await self._forget_in(uid, keep, other))
            await self._terminate(other, f"forgotten; this user's memory is {primary}")
        await self._start(uid)
        receipt = await self._forget_in(uid, request, None)
        self.reader.saw_epoch(uid, receipt.epoch)  # what this process says next is after it
        receipts.append(receipt)
        return _merged(receipts)

    async def forget_epoch(self, user_id: str) -> int | None:
        """The user's forget epoch for the messages of a turn starting now (docs/ARCHITECTURE.md,
        "Forget epochs"): read from Redis, never lower than one this client saw before; None
        when it cannot be known (no Redis answer and none seen). Never raises for a usable id."""
        return await self.reader.forget_epoch(validate_user_id(user_id))

    def known_epoch(self, user_id: str) -> int | None:
        """The highest forget epoch of the user this client saw, without I/O (None: none, or
        a client without Redis, which stamps none)."""
        return self.reader.known_epoch(user_id) if self.reader.redis is not None else None

    async def _forget_in(
        self, uid: str, request: ForgetRequest, workflow_id: str | None
    ) -> ForgetReceipt:
        """The forget saga in one workflow; returns once the data keys it retired are destroyed
        (by the run it continued as: the `shredded` update)."""
        deadline = time.monotonic() + self.update_timeout_s
        receipt: ForgetReceipt = await self._update(
            uid, UserMemoryWorkflow.forget, request, deadline=deadline, workflow_id=workflow_id
        )
        if receipt.keys_pending:
            shredded = await self._update(
                uid,
                UserMemoryWorkflow.shredded,
                ShredRequest(),
                deadline=deadline,
                workflow_id=workflow_id,
            )
            if shredded is not None:
                receipt = shredded
        return receipt

    async def _running(self, workflow_id: str) -> bool:
        """Whether a run of this workflow id is open (MemoryUnavailableError if unknown)."""
        from temporalio.client import WorkflowExecutionStatus

        handle = self.temporal.get_workflow_handle(workflow_id)
        try:
            desc = await handle.describe(rpc_timeout=self._rpc(self.signal_timeout_s))
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise MemoryUnavailableError(f"cannot reach the memory workflow: {err}") from err
        except (RuntimeError, RPCTimeoutOrCancelledError) as err:
            raise MemoryUnavailableError(f"cannot reach the memory workflow: {err}") from err
        return desc.status == WorkflowExecutionStatus.RUNNING

    async def _terminate(self, workflow_id: str, reason: str) -> None:
        try:
            await self.temporal.get_workflow_handle(workflow_id).terminate(
                reason=reason, rpc_timeout=self._rpc(self.signal_timeout_s)
            )
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise MemoryUnavailableError(f"cannot end the memory workflow: {err}") from err

    async def retry_round(self, user_id: str, event_id: str) -> RetryRoundResult:
        """Re-run a failed round (event id from `status().rounds`); ValueError if there is none
        (InvalidInputError, a ValueError, when the user has no recent round of that id or it
        did not fail)."""
        uid = validate_user_id(user_id)
        request = _request(RetryRoundRequest, event_id=event_id)
        try:
            return await self._update(uid, UserMemoryWorkflow.retry_round, request)
        except LookupError as err:
            raise ValueError(f"user {user_id!r} has no memory workflow") from err

    async def consolidate(self, user_id: str, thread_id: str) -> ConsolidateResult:
        """Slice the thread's pending messages now instead of at maturity (call it when a
        session ends); hand-overs submitted before this call are included. Returns how many
        messages were pending; `settle` then waits until they are indexed and published.
        `thread_id` is the agent's thread id, as the middleware keys it (models.ids.thread_key)."""
        uid = validate_user_id(user_id)
        thread_id = thread_key(thread_id)
        request = _request(ConsolidateRequest, thread_id=thread_id)
        try:
            return await self._update(uid, UserMemoryWorkflow.consolidate, request)
        except LookupError:
            return ConsolidateResult(thread_id=thread_id)  # no memory yet: nothing to slice

    async def update_config(
        self,
        user_id: str,
        *,
        vocation: Vocation | str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> MemoryConfig:
        """Change a user's preset (`vocation`) and/or any MemoryConfig field (`params`); rounds
        started from now on use the result, which is returned (and kept across continue-as-new).

        Raises ValueError naming an unknown field or an invalid value; nothing is changed then.
        """
        uid = validate_user_id(user_id)
        if params is not None and not isinstance(params, Mapping):
            raise InvalidInputError(
                f"params must be a mapping of MemoryConfig fields, got {type(params).__name__}"
            )
        self.config.updated(vocation, params)  # the same check the workflow runs, before an RPC
        request = ConfigUpdate(vocation=vocation, params=dict(params or {}))
        await self._start(uid)
        result = await self._update(uid, UserMemoryWorkflow.update_config, request)
        return result.config  # type: ignore[no-any-return]

    async def __aenter__(self) -> MemoryClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Deliver what is queued (up to `close_timeout_s`; what is left is logged, see
        `resync`), then close the Redis client if this client built it (the Temporal client
        is the caller's)."""
        try:
            await self.outbox.aclose(self.close_timeout_s)
        finally:
            close = getattr(self.searcher, "close", None)
            if close is not None:
                await close()
            await self.reader.aclose()

    # --- plumbing -------------------------------------------------------------------------

    @staticmethod
    def _rpc(seconds: float) -> timedelta:
        return timedelta(seconds=seconds)

    def _update_seconds(self, timeout_s: float | None) -> float:
        """An update's time bound: `timeout_s` if given (checked), else `update_timeout_s`."""
        return _seconds(timeout_s, self.update_timeout_s)

    def _handle(self, uid: str) -> WorkflowHandle[Any, Any]:
        return self.temporal.get_workflow_handle_for(UserMemoryWorkflow.run, self.workflow_id(uid))

    def workflow_id(self, user_id: str) -> str:
        """The user's memory workflow id (hash-only when user keys are pseudonymous)."""
        uid = validate_user_id(user_id)
        return pseudonymous_workflow_id(uid) if self._secret else user_workflow_id(uid)

    def search_user(self, user_id: str) -> str:
        """The MnemoflowUser search-attribute value of a user (what to type in the Temporal UI)."""
        return search_user_value(validate_user_id(user_id), self._secret)

    def _input(self, uid: str) -> UserMemoryInput:
        return UserMemoryInput(
            user_id=uid,
            config=self.config,
            prices=self.prices,
            llm_task_queue=self.llm_task_queue,
            search_attributes=self.search_attributes,
            search_user=search_user_value(uid, self._secret),
            pseudonymous=self._secret is not None,
        )

    async def _start(self, uid: str, *, timeout_s: float | None = None, **signal: Any) -> None:
        """Start the user's workflow if absent (signal-with-start when a signal is given),
        waiting at most `timeout_s` when that is shorter than `signal_timeout_s`."""
        attributes = None
        if self.search_attributes:
            value = search_user_value(uid, self._secret)
            attributes = TypedSearchAttributes([SearchAttributePair(sa.USER, value)])
        if not signal:
            # A plain start must not fail when the workflow runs already.
            signal = {"id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING}
        try:
            await self.temporal.start_workflow(
                UserMemoryWorkflow.run,
                self._input(uid),
                id=self.workflow_id(uid),
                task_queue=self.task_queue,
                search_attributes=attributes,
                rpc_timeout=self._rpc(min(self.signal_timeout_s, timeout_s or math.inf)),
                **signal,
            )
        except (RPCError, RuntimeError) as err:  # RuntimeError: the lazy connect failed
            raise MemoryUnavailableError(f"cannot reach the memory workflow: {err}") from err
        except RPCTimeoutOrCancelledError as err:
            raise MemoryUnavailableError(f"cannot reach the memory workflow: {err}") from err

    async def _query(self, uid: str, query: Any, timeout_s: float | None = None) -> Any:
        """Run a query (default: the hot-path timeout); LookupError when the user has no
        workflow."""
        seconds = self.query_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(
                self._handle(uid).query(query, rpc_timeout=self._rpc(seconds)),
                # The rpc timeout bounds each attempt; this bounds connecting and retries too.
                timeout=seconds + 0.5,
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise LookupError("no memory workflow for this user") from err
            raise MemoryUnavailableError(f"memory query failed: {err}") from err
        except Exception as err:  # timeouts, connection failures, a failed query
            raise MemoryUnavailableError(f"memory query failed: {err!r}") from err

    async def _update(
        self,
        uid: str,
        update: Any,
        request: Any,
        *,
        deadline: float | None = None,
        update_id: str | None = None,
        workflow_id: str | None = None,
    ) -> Any:
        """Execute an update by `deadline` (a time.monotonic() value; default `update_timeout_s`
        from now). LookupError when the user has no workflow; InvalidInputError when the
        workflow refused the request (bad input, or while the user is being forgotten);
        MemoryUnavailableError when memory did not answer by the deadline (no worker polling,
        a store down so the workflow cannot finish the request, Temporal unreachable) or the
        update failed for any other reason.

        With `update_id`: sent under that id, and once the workflow accepted it (durably, an
        UpdateAccepted event in its history), a deadline that ends before its result returns
        `_Pending`: the workflow finishes an accepted update, on another worker if one dies.

        An update the server aborted because the workflow run closed under it (it continued as
        new while the update waited) is sent again to the new run, within the deadline: every
        update is idempotent (remember by its event id)."""
        if deadline is None:
            deadline = time.monotonic() + self.update_timeout_s
        handle = (
            self._handle(uid)
            if workflow_id is None
            else self.temporal.get_workflow_handle_for(UserMemoryWorkflow.run, workflow_id)
        )
        pause = 0.1
        while True:
            left = max(deadline - time.monotonic(), 0.05)
            try:
                if update_id is not None:
                    return await self._accepted_update(handle, update, request, deadline, update_id)
                # The rpc timeout bounds each of the SDK's calls (accepted, then the result:
                # up to twice it); this bounds the whole update. Leaving early is safe: the
                # workflow still finishes the update, and every update is idempotent.
                return await asyncio.wait_for(
                    handle.execute_update(update, request, rpc_timeout=self._rpc(left)),
                    timeout=left + 0.25,
                )
            except WorkflowUpdateFailedError as err:
                cause = err.cause
                if isinstance(cause, ApplicationError) and cause.type in REFUSED_TYPES:
                    raise InvalidInputError(cause.message) from err
                raise MemoryUnavailableError(f"memory update failed: {cause or err}") from err
            except (WorkflowUpdateRPCTimeoutOrCancelledError, TimeoutError) as err:
                raise MemoryUnavailableError(
                    f"memory did not answer the update within {left:.3g} s "
                    f"({err or type(err).__name__}): no worker "
                    "is serving it, or a store it needs is down"
                ) from err
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    raise LookupError("no memory workflow for this user") from err
                if _run_closed_under(err) and time.monotonic() + pause < deadline:
                    await asyncio.sleep(pause)  # back-off before the new run is asked
                    pause = min(pause * 2, 1.0)
                    continue
                raise MemoryUnavailableError(f"memory update failed: {err}") from err
            except (RuntimeError, RPCTimeoutOrCancelledError) as err:  # the lazy connect failed
                raise MemoryUnavailableError(f"memory update failed: {err}") from err

    async def _accepted_update(
        self, handle: Any, update: Any, request: Any, deadline: float, update_id: str
    ) -> Any:
        """`_update`'s body with an id: wait for the workflow to accept the update, then for
        its result until `deadline`; `_Pending` when the deadline ends after the acceptance."""
        left = max(deadline - time.monotonic(), 0.05)
        started = await asyncio.wait_for(
            handle.start_update(
                update,
                request,
                id=update_id,
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                rpc_timeout=self._rpc(left),
            ),
            timeout=left + 0.25,
        )
        left = max(deadline - time.monotonic(), 0.05)
        try:
            return await asyncio.wait_for(
                started.result(rpc_timeout=self._rpc(left)), timeout=left + 0.25
            )
        except (WorkflowUpdateRPCTimeoutOrCancelledError, TimeoutError):
            return _Pending(started.workflow_run_id)  # accepted: the workflow finishes it

    async def _query_context(self, uid: str) -> InjectedContext:
        return await self._query(uid, UserMemoryWorkflow.context)  # type: ignore[no-any-return]

    async def _published(self, uid: str, timeout_s: float) -> Published:
        """The workflow's latest context version and the one the read model holds."""
        latest = (await self._query(uid, UserMemoryWorkflow.context, timeout_s)).version
        if self.reader.redis is None:
            return Published(latest, checked=False)
        try:
            found = await self.reader.published(uid)
        except Exception as err:  # reported as pending; settle asks again
            return Published(latest, unreadable=repr(err)[:200])
        return Published(latest, None if found is None else found.version)
