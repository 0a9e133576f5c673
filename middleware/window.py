"""Pure helpers of the middleware: stamping, identity, LangChain -> ChatTurn conversion, ids,
trimming.

Nothing here does I/O, so every rule the middleware applies to a window is unit-testable alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import AnyMessage, BaseMessage, HumanMessage, ToolMessage

from mnemoflow.memory.text import estimate_tokens
from mnemoflow.memory.triggers import budget_reached, ceiling_reached, trim_start
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import Trigger
from mnemoflow.models.fragments import piece_at, quoted_texts
from mnemoflow.models.ids import thread_key, user_key, validate_user_id
from mnemoflow.models.turns import MAX_MESSAGE_ID_CHARS, ChatTurn, Role, content_identity

TIME_KEY = "time"
#: The identity the middleware gave a message when it first saw it (its id plus a digest of
#: its text then): an app that reuses one id for every turn's input still has each line
#: remembered, and a message edited later in the turn (redaction) keeps the identity it had.
IDENTITY_KEY = "mnemoflow_identity"
#: Whose turn added the message (a hash of the user id): a thread id two users share never
#: hands one user's messages to the other's memory.
OWNER_KEY = "mnemoflow_owner"
#: The user's forget epoch when the message was said (docs/ARCHITECTURE.md, "Forget epochs"):
#: read by the middleware at the start of the turn that added it, never overwritten. A message
#: of an older epoch than the user workflow's is refused, whatever its time stamp says.
EPOCH_KEY = "mnemoflow_epoch"
#: The identity of the human message whose turn added a reply or tool result: a forget that
#: refuses that message (said before it) refuses the rest of its turn too.
TURN_KEY = "mnemoflow_turn"
#: fragment id -> the words of that injected fragment a reply quotes: cut out when the fragment
#: is forgotten with its quotes before the reply is delivered (docs/ARCHITECTURE.md, forget).
QUOTES_KEY = "mnemoflow_quotes"
#: Set on a message the middleware stamped with its own clock although it was said before the
#: turn that first saw it: when it was said is unknown, so a user workflow that forgot its user
#: refuses it (`ChatTurn.unstamped`), as it refuses copies re-sent with no stamp.
TIME_ASSUMED_KEY = "mnemoflow_time_assumed"
#: Set on a message a read-only middleware (`remember=False`) was the first to see: it is never
#: handed over, not by a later turn of a middleware that remembers, nor by `resync`.
UNKEPT_KEY = "mnemoflow_unkept"
#: Messages other middleware writes from earlier ones (LangChain's summaries): not said by
#: anyone, so never stored as memory.
DERIVED_SOURCES = frozenset({"summarization"})
DEFAULT_THREAD = "default"
_ROLES: dict[str, Role] = {
    "human": "human",
    "user": "human",
    "ai": "ai",
    "assistant": "ai",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}


#: The latest plausible stamp in seconds (the start of year 5000). A number past it is a stamp
#: in a finer unit (JavaScript's `Date.now()` milliseconds, microseconds, `time.time_ns()`
#: nanoseconds), read by dividing by 1000 until it is back under this bound; any of those units
#: of a date after 1973 lands within it.
MAX_SECONDS_STAMP = 95_617_584_000.0
#: How far ahead of the host's clock an earlier message's stamp may be and still hold back the
#: stamp the middleware gives the messages after it (`stamp_times`): a caller's skewed clock
#: or a time zone misread, never a stamp years ahead, which would hold every later message.
MAX_STAMP_LEAD = 86_400.0

log = logging.getLogger(__name__)
_warned: set[str] = set()


def message_time(message: BaseMessage) -> float | None:
    """The message's stamp in unix seconds, or None when absent or unusable
    (docs/ARCHITECTURE.md, "Message identity", stamps).

    Accepted: a number of seconds; a number too large to be seconds (past MAX_SECONDS_STAMP) is
    milliseconds, microseconds or nanoseconds and is scaled down; a numeric string; a
    `datetime` or an ISO-8601 string, aware (its UTC instant, "Z" included) or naive (read as
    UTC). Unusable: not finite, or not after 1970 (a 0 or negative stamp is a caller's
    placeholder, and the workflow refuses anything at or before its horizon), or anything else;
    such a stamp is logged once (warning) and the message is stamped with the host's clock."""
    value = message.additional_kwargs.get(TIME_KEY)
    if value is None:
        return None
    stamp = _read_stamp(value)
    if stamp is None or not math.isfinite(stamp) or stamp <= 0:
        _warn_unreadable(value)
        return None
    while stamp > MAX_SECONDS_STAMP:
        stamp /= 1000.0
    return stamp


def _read_stamp(value: object) -> float | None:
    """Seconds of a stamp as given (no unit scaling), or None when it is no time at all."""
    if isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return _instant(value)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int past float's range
            return None
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        try:  # Python 3.11 reads every ISO-8601 form, "Z" included
            return _instant(datetime.fromisoformat(text))
        except ValueError:
            return None
    try:  # a numpy or Decimal number
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None


def _instant(moment: datetime) -> float | None:
    """The UTC instant of a datetime; a naive one is read as UTC (documented)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return moment.timestamp()
    except (OverflowError, ValueError, OSError):
        return None


def _warn_unreadable(value: object) -> None:
    """Log an unusable stamp once per kind (its type), not once per message or per hook."""
    kind = type(value).__name__
    if kind in _warned or len(_warned) > 64:
        return
    _warned.add(kind)
    log.warning(
        "a message's additional_kwargs[%r] is not a usable time (%s %.60r): it is stamped with "
        "this host's clock instead; give unix seconds (or ms/us/ns), a datetime or an ISO-8601 "
        "string (logged once per kind)",
        TIME_KEY,
        kind,
        value,
    )


def _identity_stamp(message: BaseMessage) -> float:
    """The stamp as identities of messages without an id always hashed it (a finite positive
    number as given, else 0): an identity never changes with how stamps are read."""
    value = message.additional_kwargs.get(TIME_KEY)
    if isinstance(value, bool):
        return 0.0
    try:
        stamp = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return stamp if math.isfinite(stamp) and stamp > 0 else 0.0


def stamp_times(messages: Sequence[BaseMessage], now: float) -> list[float]:
    """The time of each message: its own stamp (`message_time`), else what the middleware stamps
    it with: `now`, but never earlier than the stamps before it in the list (up to
    MAX_STAMP_LEAD ahead of `now`). A caller whose clock runs ahead of this host's stamps its
    human line ahead; the reply stamped with this host's clock would sort before its question
    in a round (rounds order by time, then position), so it takes the question's time and the
    position keeps the list's order."""
    return _stamp_times(messages, now)[0]


def next_stamp(before: Sequence[BaseMessage], now: float) -> float:
    """The stamp of a message the middleware stamps after `before` (`stamp_times`)."""
    return _stamp_times(before, now)[1]


def _stamp_times(messages: Sequence[BaseMessage], now: float) -> tuple[list[float], float]:
    times: list[float] = []
    latest = now
    for message in messages:
        stamp = message_time(message)
        if stamp is None:
            stamp = latest
        elif latest < stamp <= now + MAX_STAMP_LEAD:
            latest = stamp
        times.append(stamp)
    return times, latest


def message_epoch(message: BaseMessage) -> int | None:
    """The forget epoch stamped on the message (None: not stamped, or not a usable one)."""
    value = message.additional_kwargs.get(EPOCH_KEY)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def owner_of(user_id: str) -> str:
    """The owner stamp of a user's messages (a hash: the graph state never holds the raw id)."""
    return user_key(user_id)[:24]


def stamp_messages(
    messages: Sequence[AnyMessage],
    now: float,
    owner: str | None = None,
    epoch: int | None = None,
    *,
    keep: bool = True,
) -> list[AnyMessage]:
    """Copies (same ids) of the messages missing a time stamp (or, given `owner`, an owner
    stamp), stamped `now` (never earlier than the stamps before them, `stamp_times`) and their
    owner (`message_owners`); other messages are untouched. `keep` False (a read-only turn)
    marks the messages new to the middleware as never to be remembered (`UNKEPT_KEY`).

    Returned as a state update, add_messages replaces each message by id; an existing stamp is
    never overwritten, because an external stamp (set at ingestion) is the more exact one, and
    a message keeps the owner whose turn added it. A message new to the middleware (no owner
    yet) is also given its identity (`IDENTITY_KEY`) and, when known, the user's forget
    epoch the turn started under (`EPOCH_KEY`): only a message new to the middleware, so a
    message said before a forget never takes the epoch after it.
    """
    owners = message_owners(messages, owner) if owner is not None else None
    times = stamp_times(messages, now)
    latest = last_human_position(messages)
    stamped: list[AnyMessage] = []
    for position, message in enumerate(messages):
        if message.id is None:
            continue
        kwargs = dict(message.additional_kwargs)
        if message_time(message) is None:
            kwargs[TIME_KEY] = times[position]
            if owners is not None and not _owner_stamp(message) and position < (latest or 0):
                # Never seen by memory and before this turn's input (a thread an app restored
                # from its own database, a failed turn's line): when it was said is unknown.
                kwargs[TIME_ASSUMED_KEY] = True
        if owners is not None and not _owner_stamp(message):
            kwargs[OWNER_KEY] = owners[position]
            if _stamped_identity(message) is None:
                kwargs[IDENTITY_KEY] = fresh_identity(message)
            if epoch is not None and EPOCH_KEY not in kwargs:
                kwargs[EPOCH_KEY] = epoch
            if not keep:
                kwargs[UNKEPT_KEY] = True
        if kwargs != message.additional_kwargs:
            stamped.append(message.model_copy(update={"additional_kwargs": kwargs}))
    return stamped


def _owner_stamp(message: BaseMessage) -> str | None:
    stamp = message.additional_kwargs.get(OWNER_KEY)
    return stamp if isinstance(stamp, str) and stamp else None


def message_owners(messages: Sequence[BaseMessage], owner: str) -> list[str]:
    """The owner of each message, for a turn of the user whose owner stamp is `owner`.

    A stamped message has its stamp. An unstamped one was added by a turn that failed before
    the middleware stamped it (a sync invoke, a bad user id), or before owner stamps existed,
    or by other middleware after memory's last hook saw the list, or it is the current turn's
    input. It belongs to the user whose turn added it, and when the list cannot tell whose that
    was, to nobody (`UNKNOWN_OWNER`): a thread id several users share must never hand one
    user's line to another (docs/ARCHITECTURE.md, "Message identity", ownership):
    - from the latest human message on, it is the current turn's, the current user's, when
      that human message is theirs (stamped with `owner`, or unstamped: the turn's input);
      after another user's stamped question it was added in that user's turn: nobody's here;
    - earlier, after the current user's messages only, it is theirs: a user's failed turn is
      stored with their next one; with no stamped message before it, it is theirs only when no
      message of the list is stamped another user's;
    - earlier, after another user's message, it is nobody's: it may be a line of that user's
      failed turn or a line of the current user's input (a list of several messages), and the
      list alone cannot tell which, so it is stored for neither.
    """
    latest = last_human_position(messages)
    stamps = [_owner_stamp(m) for m in messages]
    asker = stamps[latest] if latest is not None else None
    turn_is_theirs = asker is None or asker == owner
    shared = any(s is not None and s != owner for s in stamps)
    owners: list[str] = []
    previous: str | None = None
    for position, stamp in enumerate(stamps):
        if stamp is not None:
            previous = stamp
        elif latest is not None and position >= latest:
            stamp = owner if turn_is_theirs else UNKNOWN_OWNER
        elif previous == owner or (previous is None and not shared):
            stamp = owner
        else:
            stamp = UNKNOWN_OWNER
        owners.append(stamp)
    return owners


#: The owner stamp of a message whose user cannot be known: no user's memory.
UNKNOWN_OWNER = "unknown"


def owned_by(messages: Sequence[BaseMessage], owner: str) -> list[bool]:
    """Whether each message is the memory of the user whose owner stamp is `owner`: theirs
    (`message_owners`) and not derived by other middleware."""
    return [
        not is_derived(m) and o == owner
        for m, o in zip(messages, message_owners(messages, owner), strict=True)
    ]


def is_unkept(message: BaseMessage) -> bool:
    """Said in a read-only turn (`UNKEPT_KEY`): never memory."""
    return message.additional_kwargs.get(UNKEPT_KEY) is True


def is_derived(message: BaseMessage) -> bool:
    """Written by other middleware from earlier messages (a summary), not said by anyone."""
    return message.additional_kwargs.get("lc_source") in DERIVED_SOURCES


def belongs_to(message: BaseMessage, owner: str) -> bool:
    """Said in this user's turns, judged on the message alone (an unstamped message counts as
    theirs): use `message_owners` on the whole list where an unstamped one may be another's."""
    stamp = _owner_stamp(message)
    return stamp is None or stamp == owner


def clean_text(value: str) -> str:
    """`value` with every lone surrogate (a broken emoji from a bad decoder) as U+FFFD: such a
    string cannot be encoded, so a contract holding it would fail at every retry."""
    return _LONE_SURROGATE.sub("\ufffd", value)


def _id_part(ident: str, room: int) -> str:
    """An id as it may appear in an identity: itself when short and encodable, else a hash of
    it (two ids never share a hash, as they would share a cleaned form)."""
    if len(ident) > room or _LONE_SURROGATE.search(ident):
        return content_identity("id", ident, 0.0)
    return ident


def legacy_identity(message: BaseMessage) -> str:
    """The identity of a message the middleware has not stamped (docs/ARCHITECTURE.md,
    "Message identity"): its id; for a tool result without one, its tool call id; else a hash of
    role, content and time. Messages stamped before identities carried a digest keep it."""
    if message.id:
        return _id_part(str(message.id), MAX_MESSAGE_ID_CHARS)
    if isinstance(message, ToolMessage) and message.tool_call_id:
        return _id_part(f"tool:{message.tool_call_id}", MAX_MESSAGE_ID_CHARS)
    return content_identity(message_role(message), message_text(message), _identity_stamp(message))


def fresh_identity(message: BaseMessage) -> str:
    """The identity the middleware stamps on a message it sees first: its id (or tool call id)
    plus a digest of its text, so an id an app reuses for each turn's input names each line
    apart while the same message re-sent is recognised; without an id, `legacy_identity`."""
    base = legacy_identity(message)
    if not message.id and not (isinstance(message, ToolMessage) and message.tool_call_id):
        return base
    digest = hashlib.sha256(message_text(message).encode("utf-8")).hexdigest()[:_DIGEST_CHARS]
    return f"{_id_part(base, MAX_MESSAGE_ID_CHARS - _DIGEST_CHARS - 1)}#{digest}"


_DIGEST_CHARS = 12
_DIGEST_SUFFIX = re.compile(rf"#[0-9a-f]{{{_DIGEST_CHARS}}}$")


def identity_message_id(identity: str) -> str | None:
    """The message id part of an identity `fresh_identity` made (`id#digest of the text`);
    None for other identities (no id, or stamped before identities carried a digest)."""
    found = _DIGEST_SUFFIX.search(identity)
    return identity[: found.start()] if found else None


def _stamped_identity(message: BaseMessage) -> str | None:
    value = message.additional_kwargs.get(IDENTITY_KEY)
    if (
        isinstance(value, str)
        and value
        and len(value) <= MAX_MESSAGE_ID_CHARS
        and not _LONE_SURROGATE.search(value)
    ):
        return value
    return None


def message_identity(message: BaseMessage) -> str:
    """A message's stable identity: the one stamped when the middleware first saw it
    (`fresh_identity`), else `legacy_identity`. Always a valid ChatTurn message id."""
    return _stamped_identity(message) or legacy_identity(message)


def message_text(message: BaseMessage) -> str:
    """The text of a message; non-text parts and tool calls become short placeholders."""
    content = message.content
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    else:
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping):
                kind = str(block.get("type", "part"))
                if kind == "text" and isinstance(block.get("text"), str):
                    parts.append(block["text"])
                else:
                    parts.append(f"[{kind}]")
    for call in getattr(message, "tool_calls", None) or []:
        parts.append(tool_call_text(call))
    # A lone surrogate (a broken emoji from a bad decoder) cannot be encoded: the hand-over
    # would fail at every retry. It becomes U+FFFD; the rest of the text is kept as said.
    return clean_text("\n".join(p for p in parts if p))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
#: The memory tools' own calls (middleware/tools.py): their arguments are memory already.
MEMORY_TOOL_NAMES = frozenset({"remember_this", "recall_memories", "forget_memory", "memory_stats"})
#: Characters of a tool call's arguments kept in its text.
MAX_TOOL_ARGS_CHARS = 600


def tool_call_text(call: Mapping[str, Any]) -> str:
    """A tool call as the assistant's words: its name and, bounded, its arguments. A
    structured answer (`response_format` with a tool strategy) is such a call, and the
    arguments of any other call say what the user asked for (the dates, the order number)."""
    name = str(call.get("name") or "?")
    args = call.get("args")
    if not args or name in MEMORY_TOOL_NAMES:
        return f"[tool call: {name}]"
    text = json.dumps(args, ensure_ascii=False, default=str)
    if len(text) > MAX_TOOL_ARGS_CHARS:
        text = text[:MAX_TOOL_ARGS_CHARS] + "…"
    return f"[tool call: {name} {text}]"


def message_role(message: BaseMessage) -> Role:
    """Our role of a LangChain message (ChatMessage roles mapped; anything else counts as tool)."""
    kind = getattr(message, "role", None) if message.type == "chat" else message.type
    return _ROLES.get(str(kind), "tool")


def to_turns(
    messages: Sequence[BaseMessage],
    thread_id: str,
    now: float,
    user_id: str | None = None,
    *,
    resent: bool = False,
    skip: Collection[str] = (),
) -> list[ChatTurn]:
    """ChatTurns of the messages to remember: with `user_id`, only that user's (see
    `message_owners`); never summaries other middleware wrote. Each carries its identity; its
    position is where it sits in this list (informational).

    `resent` (`MemoryClient.resync`): copies the middleware never saw in this form, such as an
    app's own database keeps them, without memory's stamps. One with none of them is known by
    the identity the middleware stamps when it first sees a message (`fresh_identity`: its id
    and a digest of its text), so a copy of a message it handed over is the same message; one
    without a time stamp is marked `unstamped` (when it was said is unknown: a user workflow
    that forgot its user refuses it). Messages whose identity is in `skip` (known accepted
    already) are left out before they are built: a turn offers only its new messages; so are
    those said in a read-only turn (`UNKEPT_KEY`)."""
    if user_id is not None:
        keep = owned_by(messages, owner_of(user_id))
    else:
        keep = [not is_derived(m) for m in messages]
    keep = [k and not is_unkept(m) for k, m in zip(keep, messages, strict=True)]
    thread = clean_text(thread_id)
    times = stamp_times(messages, now)
    turns = []
    for position, message in enumerate(messages):
        if not keep[position]:
            continue
        identity = _resent_identity(message) if resent else message_identity(message)
        if identity in skip:
            continue
        turns.append(
            ChatTurn(
                thread_id=thread,
                position=position,
                role=message_role(message),
                content=message_text(message),
                time=times[position],
                name=None if message.name is None else clean_text(message.name),
                message_id=identity,
                epoch=message_epoch(message),
                unstamped=(resent and message_time(message) is None)
                or message.additional_kwargs.get(TIME_ASSUMED_KEY) is True,
                turn_of=_turn_of(message),
                quotes=_quotes(message),
            )
        )
    return turns


def _resent_identity(message: BaseMessage) -> str:
    """The identity of a re-sent copy: its stamped one, else (no stamp of memory's at all) the
    one the middleware would have stamped on it (`fresh_identity`)."""
    if _stamped_identity(message) is None and _owner_stamp(message) is None:
        return fresh_identity(message)
    return message_identity(message)


def _turn_of(message: BaseMessage) -> str:
    value = message.additional_kwargs.get(TURN_KEY)
    if isinstance(value, str) and len(value) <= MAX_MESSAGE_ID_CHARS:
        return clean_text(value)
    return ""


def _quotes(message: BaseMessage) -> dict[str, list[str]]:
    value = message.additional_kwargs.get(QUOTES_KEY)
    if not isinstance(value, Mapping):
        return {}
    return {
        clean_text(str(k)): [clean_text(q) for q in v if isinstance(q, str)]
        for k, v in value.items()
        if isinstance(v, list)
    }


def quoted_fragments(text: str, fragments: Sequence[Any]) -> dict[str, list[str]]:
    """Which injected fragments (`ContextFragment`s) `text` quotes, and their words it quotes
    whole (`models.fragments.quoted_texts`, found as `piece_at` finds them)."""
    found: dict[str, list[str]] = {}
    for fragment in fragments:
        content = getattr(fragment, "content", "")
        if not content:
            continue
        texts = [q for q in quoted_texts(content) if piece_at(text, q) is not None]
        if texts:
            found[str(fragment.id)] = texts
    return found


def window_tokens(messages: Sequence[BaseMessage]) -> int:
    """The estimated tokens of a window (texts only; good enough for the budget rules)."""
    return sum(estimate_tokens(message_text(m)) for m in messages)


def handover_trigger(messages: Sequence[BaseMessage], config: MemoryConfig) -> tuple[bool, Trigger]:
    """(urgent, trigger) of a hand-over, evaluated locally on the model's window."""
    tokens = window_tokens(messages)
    if ceiling_reached(tokens, config):
        return True, "ceiling"
    if budget_reached(len(messages), tokens, config):
        return False, "budget"
    return False, "handover"


def last_human_position(messages: Sequence[BaseMessage]) -> int | None:
    """Index of the latest human message, if any."""
    for position in range(len(messages) - 1, -1, -1):
        if isinstance(messages[position], HumanMessage):
            return position
    return None


def window_from(messages: Sequence[BaseMessage], start: int) -> float | None:
    """When the oldest message the model sees from `start` on was said (None: no stamp)."""
    stamps = [message_time(m) for m in messages[start:] if not is_derived(m)]
    known = [t for t in stamps if t is not None]
    return min(known) if known else None


def window_start(messages: Sequence[BaseMessage], indexed: int, config: MemoryConfig) -> int:
    """The first position the model sees: trimmed below `indexed` (how many leading messages
    are known to be indexed) only over the budget.

    Never past the latest human message; and never starting on a tool result whose tool call
    would be cut off (providers reject that), so the start moves back to the calling message.
    """
    if not budget_reached(len(messages), window_tokens(messages), config):
        return 0
    start = trim_start(len(messages), indexed, last_human_position(messages))
    while 0 < start < len(messages) and isinstance(messages[start], ToolMessage):
        start -= 1
    return start


def resolve_user_id(state: Mapping[str, Any], context: Any) -> str:
    """The user id from the runtime context (dataclass, dict or pydantic) or state["user_id"]."""
    candidate: Any = None
    if isinstance(context, Mapping):
        candidate = context.get("user_id")
    elif context is not None:
        candidate = getattr(context, "user_id", None)
    if candidate is None:
        candidate = state.get("user_id")
    if candidate is None:
        raise ValueError(
            "DurableMemoryMiddleware needs a user id: pass it as runtime context "
            "(create_agent(..., context_schema=...); agent.ainvoke(..., context={'user_id': ...})) "
            "or in the state as state['user_id']; there is no shared default user"
        )
    try:
        return validate_user_id(candidate)
    except ValueError as exc:
        raise ValueError(f"DurableMemoryMiddleware needs a usable user id: {exc}") from exc


def resolve_thread_id(runtime: Any) -> str:
    """The memory key of the run's thread (checkpointer config), else DEFAULT_THREAD; a thread id
    too long to key by, or not encodable, is keyed deterministically (models.ids.thread_key),
    so it can never fail a turn, before or after the model call.

    A graph run inside another graph's node (a sub-agent called from a tool inherits the
    parent's thread id) is a thread of its own: its key is the thread id plus the names of the
    nodes it runs under (`nested_path`), so its messages never mix with the parent thread's.
    """
    info = getattr(runtime, "execution_info", None)
    thread = getattr(info, "thread_id", None)
    namespace = getattr(info, "checkpoint_ns", None)
    if not thread or namespace is None:
        try:
            from langgraph.config import get_config

            configurable = get_config().get("configurable", {})
        except RuntimeError:  # called outside a graph run (e.g. hooks driven directly)
            configurable = {}
        thread = thread or configurable.get("thread_id")
        if namespace is None:
            namespace = configurable.get("checkpoint_ns")
    base = str(thread or DEFAULT_THREAD)
    path = nested_path(str(namespace or ""))
    return thread_key(f"{base}{NESTED_SEPARATOR}{path}" if path else base)


#: Joins a thread id and the nodes a nested graph runs under in its memory key.
NESTED_SEPARATOR = " >> "


def nested_path(checkpoint_ns: str) -> str:
    """The nodes of the parent graphs a node runs under, from its checkpoint namespace
    ("tools:<task>|model:<task>" -> "tools"); "" at the top level. Task ids are left out, so
    every run of a sub-agent under the same node shares one key."""
    segments = [s for s in checkpoint_ns.split("|") if s][:-1]
    return "/".join(s.split(":", 1)[0] for s in segments)
