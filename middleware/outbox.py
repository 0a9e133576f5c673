"""The client's outbox: every hand-over is kept until the user workflow accepted it.

A hand-over that fails (Temporal down, a timeout) is not waiting for the next turn of its
thread: one background task retries it with exponential back-off until it is accepted
(docs/ARCHITECTURE.md, "Delivery"). Messages are kept per (user, thread) by identity, so a
message captured twice (by a hook and again from the graph state) is sent once, and the
identities the workflow accepted are remembered (bounded) so the middleware can tell which of
its messages are safe. Bounded in memory: past `max_messages` messages or `max_bytes` of text
(a message's whole text counts) new messages are refused (counted
in `mnemoflow_handover_refused_total`); the graph state still holds them, so the next turn
offers them again.

Messages can be held: the middleware adds what a turn creates as it is created (a model
reply, a tool result) and releases them together after the turn, so a turn is one signal and
what is delivered is the version the turn ends with (other middleware may edit a message in
place, e.g. redact it, after it was captured). A hold belongs to each message, not to its
thread: whatever an earlier turn of the thread still has queued (a delivery in flight or
waiting for its retry) is delivered on its own, without the held messages of the turn now
running. `release` and `flush` release what a turn that failed midway left held, and nothing
stays held longer than `max_hold_s` (a turn that raised, or waits on an interrupt).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from mnemoflow.middleware.window import identity_message_id
from mnemoflow.models.contracts import Trigger
from mnemoflow.models.turns import ChatTurn, turn_identity
from mnemoflow.models.usage import LLMUsage
from mnemoflow.workflows.state_ops import stronger_trigger

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (user id, thread key)
Send = Callable[[str, list[ChatTurn], bool, Trigger, LLMUsage | None], Awaitable[object]]

MAX_OUTBOX_MESSAGES = 50_000
MAX_OUTBOX_BYTES = 64 * 1024 * 1024
MAX_ACCEPTED_PER_THREAD = 4096
MAX_TRACKED_THREADS = 10_000
MAX_PARALLEL_SENDS = 8
MAX_HOLD_S = 30.0


class OutboxMetrics:
    """What is waiting for delivery, in a registry of its own unless one is given."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.pending = Gauge(
            "mnemoflow_handover_pending_messages",
            "Messages handed to the client that the user workflow has not accepted yet",
            registry=self.registry,
        )
        self.retries = Counter(
            "mnemoflow_handover_retries_total",
            "Hand-overs retried after a failed delivery",
            registry=self.registry,
        )
        self.refused = Counter(
            "mnemoflow_handover_refused_total",
            "Messages refused because the outbox was full (offered again by the next turn)",
            registry=self.registry,
        )
        self.cut_messages = Counter(
            "mnemoflow_handover_cut_messages_total",
            "Human or AI messages longer than MemoryConfig.max_message_chars, handed over cut",
            registry=self.registry,
        )
        self.cut_chars = Counter(
            "mnemoflow_handover_cut_chars_total",
            "Characters left out of messages longer than MemoryConfig.max_message_chars",
            registry=self.registry,
        )


@dataclass
class _Entry:
    turns: OrderedDict[str, ChatTurn] = field(default_factory=OrderedDict)
    #: Identities still held by their turn, with when the hold ends by itself (monotonic).
    held: dict[str, float] = field(default_factory=dict)
    urgent: bool = False
    trigger: Trigger = "handover"
    usage: LLMUsage | None = None
    attempts: int = 0
    next_try: float = 0.0
    sending: bool = False


class Outbox:
    """Pending hand-overs per (user, thread), delivered by one background task."""

    def __init__(
        self,
        send: Send,
        *,
        max_messages: int = MAX_OUTBOX_MESSAGES,
        max_bytes: int = MAX_OUTBOX_BYTES,
        base_backoff_s: float = 0.25,
        max_backoff_s: float = 15.0,
        metrics: OutboxMetrics | None = None,
        max_hold_s: float = MAX_HOLD_S,
    ) -> None:
        if (
            max_messages < 1
            or max_bytes < 1
            or base_backoff_s <= 0
            or max_backoff_s < base_backoff_s
        ):
            raise ValueError("outbox bounds must be positive (max_backoff_s >= base_backoff_s)")
        self._send = send
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_hold_s = max_hold_s
        self._bytes = 0
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.metrics = metrics or OutboxMetrics()
        self._entries: dict[Key, _Entry] = {}
        self._accepted: OrderedDict[Key, OrderedDict[str, None]] = OrderedDict()
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._count = 0
        self._failing_since: float | None = None

    # --- what callers see -----------------------------------------------------------------

    def add(self, user_id: str, turns: Iterable[ChatTurn], *, hold: bool = False) -> int:
        """Queue turns of one (user, thread) not accepted nor queued yet; returns how many
        were new. With `hold`, new ones wait for `release` (or `max_hold_s`); without, the
        ones given are released. A message queued already is replaced by the version given
        (the same identity, as the turn now holds it) and keeps its hold."""
        added = 0
        until = time.monotonic() + self.max_hold_s
        for turn in turns:
            key = (user_id, turn.thread_id)
            identity = turn_identity(turn)
            accepted = self._accepted.get(key)
            entry = self._entries.get(key)
            if accepted is not None and identity in accepted:
                continue
            if entry is not None and identity in entry.turns:
                self._bytes += _size(turn) - _size(entry.turns[identity])
                entry.turns[identity] = turn  # the same message, seen where it now sits
                if not hold:
                    entry.held.pop(identity, None)
                continue
            if entry is not None:
                self._drop_superseded(entry, identity)
            size = _size(turn)
            if self._count >= self.max_messages or self._bytes + size > self.max_bytes:
                self.metrics.refused.inc()
                log.error(
                    "memory outbox full (%d messages, %d bytes): a message was refused; the "
                    "next turn offers it again",
                    self._count,
                    self._bytes,
                )
                continue
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.turns[identity] = turn
            if hold:
                entry.held[identity] = until
            self._count += 1
            self._bytes += size
            added += 1
        self._changed_count()
        if added and _loop_running():
            self._start()  # delivers, or releases a hold that outlived max_hold_s
        return added

    def _drop_superseded(self, entry: _Entry, identity: str) -> None:
        """Drop the held versions of the message `identity` names by id (same id, other
        text): within a turn, a message that another middleware replaced by a new object with
        the same id (a redaction) no longer exists, since the graph keeps one message per id.
        Only held ones: a released version may be on its way already."""
        base = identity_message_id(identity)
        if base is None:
            return
        for old in [i for i in entry.held if i != identity and identity_message_id(i) == base]:
            self._bytes -= _size(entry.turns.pop(old))
            del entry.held[old]
            self._count -= 1

    def release(
        self,
        user_id: str,
        thread: str,
        *,
        urgent: bool = False,
        trigger: Trigger = "handover",
        chat_usage: LLMUsage | None = None,
    ) -> None:
        """Deliver what is queued for the thread now, with the turn's trigger and chat tokens
        (these ride on the next delivery even when nothing new is queued)."""
        key = (user_id, thread)
        entry = self._entries.get(key)
        if entry is None:
            if chat_usage is None:
                return
            entry = self._entries[key] = _Entry()
        entry.held.clear()
        entry.urgent = entry.urgent or urgent
        entry.trigger = stronger_trigger(entry.trigger, trigger)
        if chat_usage is not None:
            entry.usage = chat_usage if entry.usage is None else entry.usage + chat_usage
        self._start()

    def release_all(self) -> None:
        for entry in self._entries.values():
            entry.held.clear()
        if self._entries:
            self._start()

    def accepted(self, user_id: str, thread: str, identities: Iterable[str]) -> set[str]:
        """Those of `identities` the workflow is known to have accepted (in this process)."""
        known = self._accepted.get((user_id, thread))
        return {i for i in identities if known is not None and i in known}

    def pending(self, user_id: str | None = None) -> int:
        """Messages not accepted yet (of one user, or of all)."""
        if user_id is None:
            return self._count
        return sum(len(e.turns) for (u, _), e in self._entries.items() if u == user_id)

    async def flush(self, timeout_s: float) -> int:
        """Release everything and wait up to `timeout_s` for delivery; returns how many
        messages are still undelivered (0: all accepted)."""
        self.release_all()
        deadline = time.monotonic() + timeout_s
        while self._entries:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            self._wake.set()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=left)
            except TimeoutError:
                break
        return self._count

    async def aclose(self, timeout_s: float) -> int:
        """Flush, then stop the delivery task; returns (and logs) what stayed undelivered."""
        left = await self.flush(timeout_s)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if left:
            log.warning(
                "memory client closed with %d undelivered messages; re-send them from the "
                "checkpointer with MemoryClient.resync (idempotent)",
                left,
            )
        return left

    # --- delivery -------------------------------------------------------------------------

    def _start(self) -> None:
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._deliver())

    def _changed_count(self) -> None:
        self.metrics.pending.set(self._count)
        self._changed.set()

    async def _deliver(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            for entry in self._entries.values():
                for identity in [i for i, until in entry.held.items() if until <= now]:
                    del entry.held[identity]  # the turn that held it never ended: deliver anyway
            ready = [
                (k, e)
                for k, e in self._entries.items()
                if _deliverable(e) and not e.sending and e.next_try <= now
            ][:MAX_PARALLEL_SENDS]
            if ready:
                await asyncio.gather(*(self._send_one(k, e) for k, e in ready))
                continue
            waits = [
                (e.next_try if _deliverable(e) else min(e.held.values(), default=now)) - now
                for e in self._entries.values()
                if not e.sending
            ]
            delay = max(0.0, min(waits)) if waits else None
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            except TimeoutError:
                pass

    async def _send_one(self, key: Key, entry: _Entry) -> None:
        user_id, _ = key
        turns = [t for i, t in entry.turns.items() if i not in entry.held]
        # The trigger and usage of this send; a release meanwhile sets them for the next one.
        urgent, trigger = entry.urgent, entry.trigger
        entry.urgent, entry.trigger = False, "handover"
        usage, entry.usage = entry.usage, None
        entry.sending = True
        try:
            if turns or usage is not None:
                await self._send(user_id, _ordered(turns), urgent, trigger, usage)
        except Exception as err:  # every failure is retried
            if usage is not None:
                entry.usage = usage if entry.usage is None else usage + entry.usage
            entry.urgent = entry.urgent or urgent
            entry.trigger = stronger_trigger(entry.trigger, trigger)
            entry.attempts += 1
            self.metrics.retries.inc()
            backoff = min(self.max_backoff_s, self.base_backoff_s * 2 ** (entry.attempts - 1))
            entry.next_try = time.monotonic() + backoff * random.uniform(0.8, 1.2)
            if entry.attempts == 1 or entry.attempts % 20 == 0:
                log.warning(
                    "memory hand-over failed (attempt %d, retrying in %.1f s): %r",
                    entry.attempts,
                    backoff,
                    err,
                )
            self._changed.set()
            return
        finally:
            entry.sending = False
        self._mark_accepted(key, [turn_identity(t) for t in turns])
        for turn in turns:
            entry.held.pop(turn_identity(turn), None)
            queued = entry.turns.pop(turn_identity(turn), None)
            if queued is not None:
                self._count -= 1
                self._bytes -= _size(queued)
        entry.attempts, entry.next_try = 0, 0.0
        if not entry.turns and entry.usage is None and self._entries.get(key) is entry:
            del self._entries[key]
        self._changed_count()

    def _mark_accepted(self, key: Key, identities: Sequence[str]) -> None:
        known = self._accepted.setdefault(key, OrderedDict())
        self._accepted.move_to_end(key)
        for identity in identities:
            known[identity] = None
            known.move_to_end(identity)
        while len(known) > MAX_ACCEPTED_PER_THREAD:
            known.popitem(last=False)
        while len(self._accepted) > MAX_TRACKED_THREADS:
            self._accepted.popitem(last=False)


def _deliverable(entry: _Entry) -> bool:
    """Whether the entry has something to send now: a message no turn holds, or chat usage
    when no message waits for its turn (the usage then rides on that turn's signal)."""
    if len(entry.held) < len(entry.turns):
        return True
    return entry.usage is not None and not entry.held


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _size(turn: ChatTurn) -> int:
    """What a queued message costs in memory, roughly (its text)."""
    return len(turn.content) + 64


def _ordered(turns: list[ChatTurn]) -> list[ChatTurn]:
    return sorted(turns, key=lambda t: (t.time, t.position))
