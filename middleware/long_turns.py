"""A long message is handed over whole, in parts, never cut short silently.

Every handed-over turn is bounded (`MemoryConfig.max_turn_chars`, and `payloads.MAX_TURN_BYTES`
encoded), so a round's input (at most `max_turns_per_round` turns) stays far below Temporal's
2 MB payload limit. A human or AI message longer than that used to be cut to its first
`max_turn_chars` characters with only a "[…trimmed N chars]" mark: a 120,000-character message
of 3,000 sentences kept 210 of them. It is now handed over as consecutive parts, cut at sentence
ends (else between words), which together are exactly its text; the rule "indexed exactly once
or rejected with a clear error" (docs/ARCHITECTURE.md, "Invariants") then holds part by part.

- The first part keeps the message's identity, each further part has one derived from it
  (`<identity>~p<k>`), so a re-send (retry, `resync`) is a no-op part by part, and a message
  that older code handed over cut is completed by a resync rather than stored twice.
- The parts keep the message's time, role and position: the workflow orders them as said, and
  everything that reasons by time (`pending_since`, what is in the window) sees one message.
- Only `MemoryConfig.max_message_chars` of a message are handed over (200,000 by default: the
  user workflow holds pending messages in its state, which travels in one payload when it
  continues as new); the rest of a longer one is cut, with an error log and the
  `mnemoflow_handover_cut_*` counters, never silently.
- Tool and system turns are not memory: they are cut to one turn (`payloads.trim_turn`).
"""

from __future__ import annotations

import hashlib

from mnemoflow.memory.text import cut_point
from mnemoflow.middleware.payloads import MAX_TURN_BYTES, TRIM_MARK, trim_turn
from mnemoflow.models.turns import MAX_MESSAGE_ID_CHARS, ChatTurn, turn_identity

#: Roles whose text is memory (tool and system turns are not).
MEMORY_ROLES = frozenset({"human", "ai"})
#: A cut looks back at most this share of a part for a sentence end, then for a space.
LOOK_BACK = 0.5


def part_id(identity: str, k: int) -> str:
    """The identity of a message's k-th part (k >= 1; the first part is the message itself)."""
    if k == 0:
        return identity
    suffix = f"~p{k}"
    if len(identity) + len(suffix) > MAX_MESSAGE_ID_CHARS:
        identity = "h-" + hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return identity + suffix


def _encoded(turn: ChatTurn) -> int:
    return len(turn.model_dump_json().encode("utf-8"))


def _pieces(text: str, size: int) -> list[str]:
    out: list[str] = []
    start = 0
    while start < len(text):
        end = cut_point(text, start, start + size, LOOK_BACK)
        out.append(text[start:end])
        start = end
    return out


def split_turn(turn: ChatTurn, part_chars: int, max_chars: int) -> tuple[list[ChatTurn], int]:
    """The turn as the turns to hand over, and how many of its characters were cut.

    A human or AI turn longer than `part_chars` becomes consecutive parts of at most
    `part_chars` characters (and MAX_TURN_BYTES encoded) whose texts join to its text, up to
    `max_chars` characters; past that the rest is cut and marked. Other turns are trimmed.
    """
    text = turn.content
    if turn.role not in MEMORY_ROLES:
        return [trim_turn(turn, part_chars)], 0
    if len(text) <= part_chars and _encoded(turn) <= MAX_TURN_BYTES:
        return [turn], 0
    cut = max(0, len(text) - max_chars)
    kept = text[: len(text) - cut]
    identity = turn_identity(turn)
    pieces: list[str] = []
    for piece in _pieces(kept, part_chars):
        pieces.extend(_fitting(turn, piece, part_chars))
    if cut:  # the mark fits inside the last part: the workflow cuts nothing more
        mark = TRIM_MARK.format(n=cut)
        last = pieces.pop()
        pieces.extend(_pieces(last, max(1, part_chars - len(mark))))
        pieces[-1] += mark
    parts = [
        turn.model_copy(update={"content": piece, "message_id": part_id(identity, k)})
        for k, piece in enumerate(pieces)
    ]
    return parts, cut


def _fitting(turn: ChatTurn, piece: str, size: int) -> list[str]:
    """The piece, split further while one of its parts is over MAX_TURN_BYTES encoded
    (multi-byte or escaped characters)."""
    if size <= 1 or _encoded(turn.model_copy(update={"content": piece})) <= MAX_TURN_BYTES:
        return [piece]
    half = max(1, size // 2)
    return [p for sub in _pieces(piece, half) for p in _fitting(turn, sub, half)]
