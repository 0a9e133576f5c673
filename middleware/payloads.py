"""Keeping hand-overs far below Temporal's payload limit (2 MB per payload, rejected above).

A tool can return megabytes; only a bounded prefix of any turn reaches Temporal, and the turns of
one hand-over are split into several events when together they would come near the limit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from mnemoflow.models.turns import ChatTurn

#: Budget of one event's turns, in encoded bytes: a quarter of Temporal's 2 MB payload limit,
#: leaving room for the workflow input that travels with a signal-with-start.
MAX_EVENT_BYTES = 512_000
#: No single turn may take more than this, whatever `max_turn_chars` says.
MAX_TURN_BYTES = MAX_EVENT_BYTES // 2
TRIM_MARK = " […trimmed {n} chars]"


def _size(turn: ChatTurn) -> int:
    return len(turn.model_dump_json().encode("utf-8"))


def trim_turn(turn: ChatTurn, max_chars: int) -> ChatTurn:
    """The turn with its content cut to `max_chars` (and to MAX_TURN_BYTES), marked as trimmed."""
    text = turn.content
    if len(text) <= max_chars and _size(turn) <= MAX_TURN_BYTES:
        return turn
    # The mark's worst-case length, so that kept text plus mark stays within max_chars.
    room = len(TRIM_MARK.format(n=len(text)))
    keep = min(len(text), max_chars) - room
    while True:
        kept = text[: max(0, keep)]
        out = turn.model_copy(update={"content": kept + TRIM_MARK.format(n=len(text) - len(kept))})
        if not kept or _size(out) <= MAX_TURN_BYTES:
            return out
        # Multi-byte or escaped characters: halve until the encoding fits.
        keep = len(kept) // 2


def split_event(turns: Sequence[ChatTurn]) -> Iterator[list[ChatTurn]]:
    """Consecutive chunks of the turns, each at most MAX_EVENT_BYTES when encoded."""
    chunk: list[ChatTurn] = []
    size = 0
    for turn in turns:
        n = _size(turn) + 1
        if chunk and size + n > MAX_EVENT_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(turn)
        size += n
    if chunk:
        yield chunk
