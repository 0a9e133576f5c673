"""Our own small chat-turn model: LangChain message objects never cross into Temporal."""

from __future__ import annotations

import hashlib
import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

Role = Literal["human", "ai", "system", "tool"]

#: Longest message id kept as given; a longer one is replaced by its hash (turn_identity).
MAX_MESSAGE_ID_CHARS = 256
#: The latest time a turn may carry (unix seconds, about year 318,000). A stamp in microseconds
#: or nanoseconds (1.7e15, 1.7e18) put the user workflow's maturity timer past what a timedelta
#: holds (8.64e13 s), failing its task forever. JavaScript milliseconds (1.7e12) stay under the
#: bound on purpose: older clients sent them (the middleware now reads them as seconds,
#: middleware/window.py), and running workflows hold them in their histories and state, which
#: must still decode.
MAX_TURN_TIME = 1e13


class ChatTurn(BaseModel):
    """One message of a thread, identified by `message_id` (docs/ARCHITECTURE.md, "Message
    identity"): the workflow accepts each identity of a (user, thread) once, so a re-send, a
    second writer or a rewritten message list never indexes a message twice or skips one."""

    thread_id: str = Field(min_length=1, max_length=512)
    position: int = Field(ge=0, description="where the writer saw it in its list (informational)")
    role: Role
    content: str = ""
    time: float = Field(description="unix seconds, stamped when first seen")
    name: str | None = None
    message_id: str = Field(
        "", max_length=MAX_MESSAGE_ID_CHARS, description="stable identity; '' = hash of the turn"
    )
    epoch: int | None = Field(
        None,
        ge=0,
        description="the user's forget epoch when the message was said (the agent read it at the "
        "turn's start): a message of an older epoch is refused, whatever its time stamp; None: "
        "never stamped (an older client, messages imported through resync), judged by the time "
        'fence (docs/ARCHITECTURE.md, "Forget epochs")',
    )
    unstamped: bool = Field(
        False,
        description="re-sent without a time stamp (`MemoryClient.resync` of copies from an app's "
        "own database): `time` is when it was re-sent, not when it was said, so a user workflow "
        'that forgot its user refuses it (docs/ARCHITECTURE.md, "Invariants": forget)',
    )
    turn_of: str = Field(
        "",
        max_length=MAX_MESSAGE_ID_CHARS,
        description="identity of the human message whose turn added this one (a reply, a tool "
        "result): refused with it when a forget refused or dropped that message",
    )
    quotes: dict[str, list[str]] = Field(
        default_factory=dict,
        description="fragment id -> its words this message quotes (a reply reading back an "
        "injected memory): cut out when that fragment is forgotten with its quotes",
    )

    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Fields at their defaults that turns before them lacked are left out: payloads of
        ordinary turns keep their bytes (rounds, histories)."""
        data = handler(self)
        if isinstance(data, dict):
            for key, empty in (
                ("epoch", None),
                ("unstamped", False),
                ("turn_of", ""),
                ("quotes", {}),
            ):
                if key in data and data[key] == empty:
                    del data[key]
        return data

    @field_validator("time")
    @classmethod
    def _plausible_time(cls, value: float) -> float:
        """A finite number of seconds under MAX_TURN_TIME, or a clear error naming the unit."""
        if not math.isfinite(value) or value > MAX_TURN_TIME:
            raise ValueError(
                f"ChatTurn.time must be unix seconds, finite and at most {MAX_TURN_TIME:.0e} "
                f"(got {value!r}: a stamp in microseconds or nanoseconds? divide it by 1e6 or "
                "1e9; the middleware reads such stamps itself)"
            )
        return value


def content_identity(role: str, content: str, time: float) -> str:
    """The identity of a message that has no id: a hash of its role, content and time."""
    raw = f"{role}\x1f{time!r}\x1f{content}".encode("utf-8", "surrogatepass")
    return "h-" + hashlib.sha256(raw).hexdigest()[:32]


def turn_identity(turn: ChatTurn) -> str:
    """The message's stable identity: its id, else the hash of role, content and time."""
    return turn.message_id or content_identity(turn.role, turn.content, turn.time)


def identity_digest(identity: str) -> str:
    """The short form a workflow keeps to recognise an identity (64 bits: collisions between
    the few thousand identities one user's workflow remembers are negligible)."""
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:16]
