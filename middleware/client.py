"""MemoryClient: the one client of a user's memory, shared by the middleware, tools, CLI and tests.

Every operation goes to the user's UserMemoryWorkflow (id from `models.ids.user_workflow_id`):
hand-overs by signal-with-start, reinforcement by signal, explicit operations by update. The hot
path's read (`context`) is one Redis GET of the read model, with the workflow's `context` query
as the fallback; it never raises, because an agent turn must go on when memory is down.

Errors: operations other than `context` raise `MemoryUnavailableError` when Temporal cannot be
reached in time, and ValueError for an unusable user id or argument.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from langchain_core.embeddings import Embeddings
from pydantic import ValidationError
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.service import RPCError, RPCStatusCode

from mnemoflow.middleware.payloads import split_event, trim_turn
from mnemoflow.middleware.search import FragmentSearch
from mnemoflow.models import search_attributes as sa
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
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
    RetryRoundRequest,
    RetryRoundResult,
    SubmitEvent,
    Trigger,
    UserMemoryInput,
    UserStatus,
)
from mnemoflow.models.errors import MemoryUnavailableError
from mnemoflow.models.ids import (
    context_key,
    pseudonymous_workflow_id,
    search_user_value,
    turn_event_id,
    user_workflow_id,
    validate_user_id,
)
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn
from mnemoflow.models.usage import PriceTable
from mnemoflow.workflows.user_memory import UserMemoryWorkflow

log = logging.getLogger(__name__)

#: The hot path may wait at most this long for the query fallback (docs/ARCHITECTURE.md, one GET).
MAX_QUERY_TIMEOUT_S = 2.0
#: After a clean read-model miss, ask the workflow (in the background) at most this often.
MISS_REQUERY_S = 5.0
#: Users whose background query answer is kept in process.
MAX_MISS_CACHE = 10_000


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
        search_attributes: bool = True,
        user_key_secret: str | bytes | None = None,
        embeddings: Embeddings | None = None,
    ) -> None:
        """`user_key_secret` turns on pseudonymous user keys: workflow ids and search attributes
        then carry hashes, never the raw user id (search attributes are not encrypted).
        `embeddings` (the worker's model) embeds questions for the per-call search in this
        process; without it that search is lexical only (middleware.search)."""
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
        ):
            if value <= 0:
                raise ValueError(f"{name} must be > 0")
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
        self.search_attributes = search_attributes
        if isinstance(user_key_secret, str):
            user_key_secret = user_key_secret.encode("utf-8")
        self._secret: bytes | None = user_key_secret or None
        self._owns_redis = isinstance(redis, str)
        if isinstance(redis, str):
            # No client-side retries: the hot path prefers a fast miss to a slow hit.
            redis = aioredis.Redis.from_url(
                redis,
                retry=None,
                socket_timeout=redis_timeout_s,
                socket_connect_timeout=redis_timeout_s,
            )
        self.redis: aioredis.Redis | None = redis
        self.searcher = (
            FragmentSearch(redis, key_prefix, embeddings, timeout_s=redis_timeout_s)
            if redis is not None
            else None
        )
        # Answers of background queries after clean read-model misses, and those in flight.
        self._queried: OrderedDict[str, tuple[float, InjectedContext | None]] = OrderedDict()
        self._querying: dict[str, asyncio.Task[None]] = {}

    # --- hand-over ------------------------------------------------------------------------

    async def submit(
        self,
        user_id: str,
        turns: Sequence[ChatTurn],
        *,
        urgent: bool = False,
        trigger: Trigger = "handover",
    ) -> str:
        """Hand turns of one thread to the user's workflow; returns the (last) event id.

        The event id comes from the thread and positions, so a re-send is a no-op. Each turn is
        trimmed to `config.max_turn_chars`, and the turns are split into several events when
        one would come near Temporal's payload limit.
        """
        uid = validate_user_id(user_id)
        if not turns:
            raise ValueError("submit needs at least one turn")
        if len({t.thread_id for t in turns}) != 1:
            raise ValueError("submit takes the turns of one thread at a time")
        trimmed = [trim_turn(t, self.config.max_turn_chars) for t in turns]
        trimmed.sort(key=lambda t: t.position)
        event_id = ""
        for chunk in split_event(trimmed):
            event_id = turn_event_id(chunk[0].thread_id, chunk[0].position, chunk[-1].position + 1)
            event = SubmitEvent(event_id=event_id, turns=chunk, urgent=urgent, trigger=trigger)
            await self._start(uid, start_signal="submit", start_signal_args=[event])
        return event_id

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
        """The user's injected context: one Redis GET, else the workflow query, else None.

        The query is awaited only when Redis fails (or holds an unreadable value); when Redis
        simply has nothing for the user, the query runs in the background and its answer serves
        later calls. Never raises: a missing or unreachable memory means a turn without memory.
        """
        try:
            uid = validate_user_id(user_id)
        except ValueError:
            return None
        reachable, cached = await self._read_model_state(uid)
        if cached is not None:
            return cached
        if reachable:
            # Redis answered "nothing published yet": the workflow has nothing newer to say
            # unless the read model was lost, so ask it off the turn (measured: the query
            # waits 30-200 ms on a busy worker, every turn until the first round publishes).
            return self._miss(uid)
        try:
            return await self._query(uid, UserMemoryWorkflow.context)
        except (MemoryUnavailableError, LookupError):
            return None

    async def search(self, user_id: str, query: str, now: float) -> list[ContextFragment] | None:
        """All of the user's fragments ranked for `query` (middleware.search); None when there
        is nothing to search (no Redis, or no corpus yet). Errors propagate: the caller bounds
        this with a deadline and falls back to the published context."""
        uid = validate_user_id(user_id)
        if self.searcher is None:
            return None
        return await self.searcher.search(uid, query, self.config, now) or None

    async def profile(self, user_id: str) -> UserProfile | None:
        """The stored profile (workflow query, else the read model); None if the user is unknown."""
        uid = validate_user_id(user_id)
        try:
            return await self._query(uid, UserMemoryWorkflow.profile)
        except LookupError:
            return None
        except MemoryUnavailableError:
            cached = await self._read_model(uid)
            if cached is None:
                raise
            return cached.profile

    async def status(self, user_id: str) -> UserStatus | None:
        """The workflow's status query; None if the user has no memory workflow."""
        uid = validate_user_id(user_id)
        try:
            return await self._query(uid, UserMemoryWorkflow.status)
        except LookupError:
            return None

    # --- explicit operations (updates) ----------------------------------------------------

    async def remember(
        self,
        user_id: str,
        text: str,
        *,
        theme: str = "remembered",
        types: Sequence[str] = ("fact",),
        event_id: str | None = None,
    ) -> RememberResult:
        """Store `text` as an explicit fragment; pass `event_id` to make a retry store it once."""
        uid = validate_user_id(user_id)
        request = RememberRequest(
            event_id=event_id or f"remember-{uuid.uuid4().hex}",
            content=text[:8000],
            theme=theme,
            types=list(types),
        )
        await self._start(uid)
        return await self._update(uid, UserMemoryWorkflow.remember, request)

    async def recall(self, user_id: str, query: str, top_k: int = 5) -> RecallResult:
        """Score the user's fragments for `query`, best first (empty for an unknown user)."""
        uid = validate_user_id(user_id)
        request = RecallRequest(query=query[:4000], top_k=top_k)
        try:
            return await self._update(uid, UserMemoryWorkflow.recall, request)
        except LookupError:
            return RecallResult(fragments=[])

    async def forget_fragment(self, user_id: str, fragment_id: str) -> ForgetFragmentResult:
        """Delete one of the user's fragments (0 deleted when it is not theirs)."""
        uid = validate_user_id(user_id)
        request = ForgetFragmentRequest(fragment_id=fragment_id)
        try:
            return await self._update(uid, UserMemoryWorkflow.forget_fragment, request)
        except LookupError:
            return ForgetFragmentResult(deleted=0)

    async def forget(self, user_id: str, reason: str = "user request") -> ForgetReceipt:
        """Forget the user entirely (the workflow's forget saga); returns its receipt."""
        uid = validate_user_id(user_id)
        await self._start(uid)
        return await self._update(uid, UserMemoryWorkflow.forget, ForgetRequest(reason=reason))

    async def retry_round(self, user_id: str, event_id: str) -> RetryRoundResult:
        """Re-run a failed round (event id from `status().rounds`); ValueError if there is none."""
        uid = validate_user_id(user_id)
        try:
            return await self._update(
                uid, UserMemoryWorkflow.retry_round, RetryRoundRequest(event_id=event_id)
            )
        except LookupError as err:
            raise ValueError(f"user {user_id!r} has no memory workflow") from err

    async def aclose(self) -> None:
        """Close the Redis client if this client built it (the Temporal client is the caller's)."""
        for task in list(self._querying.values()):
            task.cancel()
        await asyncio.gather(*self._querying.values(), return_exceptions=True)
        if self.redis is not None and self._owns_redis:
            await self.redis.aclose()

    # --- plumbing -------------------------------------------------------------------------

    @staticmethod
    def _rpc(seconds: float) -> timedelta:
        return timedelta(seconds=seconds)

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

    async def _start(self, uid: str, **signal: Any) -> None:
        """Start the user's workflow if absent (signal-with-start when a signal is given)."""
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
                rpc_timeout=self._rpc(self.signal_timeout_s),
                **signal,
            )
        except (RPCError, RuntimeError) as err:  # RuntimeError: the lazy connect failed
            raise MemoryUnavailableError(f"cannot reach the memory workflow: {err}") from err

    async def _query(self, uid: str, query: Any) -> Any:
        """Run a query with the hot-path timeout; LookupError when the user has no workflow."""
        try:
            return await asyncio.wait_for(
                self._handle(uid).query(query, rpc_timeout=self._rpc(self.query_timeout_s)),
                # The rpc timeout bounds each attempt; this bounds connecting and retries too.
                timeout=self.query_timeout_s + 0.5,
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise LookupError("no memory workflow for this user") from err
            raise MemoryUnavailableError(f"memory query failed: {err}") from err
        except Exception as err:  # timeouts, connection failures, a failed query
            raise MemoryUnavailableError(f"memory query failed: {err!r}") from err

    async def _update(self, uid: str, update: Any, request: Any) -> Any:
        """Execute an update; LookupError when the user has no workflow."""
        try:
            return await self._handle(uid).execute_update(
                update, request, rpc_timeout=self._rpc(self.update_timeout_s)
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise LookupError("no memory workflow for this user") from err
            raise MemoryUnavailableError(f"memory update failed: {err}") from err
        except RuntimeError as err:  # the lazy connect failed
            raise MemoryUnavailableError(f"memory update failed: {err}") from err

    async def _read_model(self, uid: str) -> InjectedContext | None:
        """One GET of the published context; None on a miss, a bad value or any Redis error."""
        return (await self._read_model_state(uid))[1]

    async def _read_model_state(self, uid: str) -> tuple[bool, InjectedContext | None]:
        """(Redis answered with no usable value = a clean miss, the context). A Redis error or
        an unreadable value is not a clean miss: the caller then queries the workflow."""
        if self.redis is None:
            return False, None
        try:
            async with asyncio.timeout(self.redis_timeout_s):
                raw = await self.redis.get(context_key(self.key_prefix, uid))
        except Exception as err:  # any Redis failure means "use the fallback"
            log.debug("read model unavailable: %r", err)
            return False, None
        if raw is None:
            self._queried.pop(uid, None)
            return True, None
        try:
            return False, InjectedContext.model_validate_json(raw)
        except ValidationError:
            log.warning("unreadable read-model value; using the workflow query")
            return False, None

    def _miss(self, uid: str) -> InjectedContext | None:
        """On a clean Redis miss: what an earlier background query found (or None), and a new
        background query at most every MISS_REQUERY_S per user. Never waits."""
        now = time.monotonic()
        found_at, found = self._queried.get(uid, (float("-inf"), None))
        if uid not in self._querying and now - found_at >= MISS_REQUERY_S:
            task = asyncio.get_running_loop().create_task(self._query_later(uid))
            self._querying[uid] = task
        return found

    async def _query_later(self, uid: str) -> None:
        try:
            found = await self._query(uid, UserMemoryWorkflow.context)
        except (MemoryUnavailableError, LookupError):
            found = None
        finally:
            self._querying.pop(uid, None)
        self._queried[uid] = (time.monotonic(), found)
        self._queried.move_to_end(uid)
        while len(self._queried) > MAX_MISS_CACHE:
            self._queried.popitem(last=False)
