"""Fragment rows in Milvus: column limits, conversion to and from `Fragment`, safe filters.

Limits are in UTF-8 bytes because standalone Milvus measures VARCHAR `max_length` in bytes
(Milvus Lite counts characters, so a byte budget is safe on both). Text longer than a column is
trimmed on purpose, never rejected: a fragment whose content outgrew 64 KiB is a slicer mistake,
and storing its first 64 KiB keeps the round (and the user's memory) moving, whereas a permanent
error would leave the round's messages un-indexed for ever.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from mnemoflow.models.errors import InvalidInputError
from mnemoflow.models.fragments import Fragment, LineNote
from mnemoflow.models.ids import MAX_USER_ID_CHARS, user_key, validate_user_id

PK_MAX_BYTES = 128
USER_KEY_MAX_BYTES = 64
USER_ID_MAX_BYTES = 4 * MAX_USER_ID_CHARS  # any 4096-character id fits, whatever its script
CONTENT_MAX_BYTES = 65_535  # Milvus's VARCHAR ceiling
THEME_MAX_BYTES = 1024
TYPES_MAX = 16
_PLAIN_TYPE = re.compile(r"[A-Za-z0-9_ .:-]{1,64}")
TYPE_MAX_BYTES = 64
THREAD_ID_MAX_BYTES = 2048
CALL_ID_MAX_BYTES = 2048

# Ids end up inside filter expressions (`pk in [...]`), so only a conservative alphabet is
# stored. mnemoflow.models.ids only produces such ids; anything else cannot be in the collection.
_ID_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")

SCALAR_FIELDS: list[str] = [
    "pk",
    "user_id",
    "content",
    "theme",
    "types",
    "created_at",
    "reinforced_at",
    "strengthen_count",
    "round_no",
    "thread_id",
    "start_pos",
    "end_pos",
    "explicit",
    "last_call_id",
]
ALL_FIELDS: list[str] = [*SCALAR_FIELDS, "user_key", "vector"]
#: The column of each line's notes (`models.fragments.LineNote`, JSON), in collections created
#: since the notes; a collection created before has none and its rows are stored without them
#: (docs/ARCHITECTURE.md, "Dated lines and write-time enrichment").
NOTES_FIELD = "notes"
NOTES_MAX_BYTES = CONTENT_MAX_BYTES


def cosines(vectors: list[list[float]], query: list[float]) -> list[float]:
    """Exact cosine of each vector with the query (zero vectors score 0)."""
    matrix = np.asarray(vectors, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1) * float(np.linalg.norm(q))
    return [float(c) for c in (matrix @ q) / np.maximum(norms, 1e-12)]


def clip(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` UTF-8 bytes, never inside a character."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    return raw[:max_bytes].decode("utf-8", errors="ignore")


def is_valid_id(fragment_id: str) -> bool:
    """True for ids that may be stored (and so may be put in a filter expression)."""
    return _ID_RE.fullmatch(fragment_id) is not None


def storable_ids(ids: Iterable[str]) -> list[str]:
    """The distinct ids that could be in the store, in first-seen order (others can't exist)."""
    return list(dict.fromkeys(i for i in ids if isinstance(i, str) and is_valid_id(i)))


def checked_user(user_id: str) -> str:
    """The user's partition key; an unusable user id is a permanent InvalidInputError."""
    try:
        return user_key(validate_user_id(user_id))
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from exc


def user_filter(key: str) -> str:
    """Filter expression for one user's rows (the key is hex, asserted, never a raw user id)."""
    if not re.fullmatch(r"[0-9a-f]{1,64}", key):
        raise InvalidInputError("user key must be hex")
    return f'user_key == "{key}"'


def types_filter(types: Iterable[str]) -> str:
    """Rows holding any of `types` ("" for none). Types outside a plain alphabet are left out:
    they cannot be quoted into a filter safely, and a far fragment of such a type is only
    missed as a floor candidate, never mis-scored."""
    safe = sorted({t for t in types if _PLAIN_TYPE.fullmatch(t)})
    if not safe:
        return ""
    return f"array_contains_any(types, [{', '.join(json.dumps(t) for t in safe)}])"


def ids_filter(key: str, ids: list[str]) -> str:
    """One user's rows among `ids` (already passed through `storable_ids`)."""
    if not all(is_valid_id(i) for i in ids):
        raise InvalidInputError("fragment ids must match [A-Za-z0-9_.:@-]{1,128}")
    # json.dumps gives a double-quoted literal; the alphabet above has nothing to escape.
    return f"{user_filter(key)} and pk in [{', '.join(json.dumps(i) for i in ids)}]"


def notes_json(notes: list[LineNote], max_bytes: int = NOTES_MAX_BYTES) -> str:
    """The notes as the column holds them: JSON, within `max_bytes` (the indexed terms are cut
    from the longest first; the dates shown with the lines are kept)."""
    items = [[n.when, n.terms] for n in notes]
    text = json.dumps(items, ensure_ascii=False, separators=(",", ":"))
    while len(text.encode("utf-8")) > max_bytes:
        longest = max(range(len(items)), key=lambda i: len(items[i][1]))
        if not items[longest][1]:
            return "[]"
        items[longest][1] = items[longest][1][: len(items[longest][1]) // 2]
        text = json.dumps(items, ensure_ascii=False, separators=(",", ":"))
    return text


def notes_of(raw: object) -> list[LineNote]:
    """The notes a row holds ([] for a row stored without them, or an unreadable value)."""
    if not isinstance(raw, str) or not raw:
        return []
    try:
        items = json.loads(raw)
        return [LineNote(when=str(w), terms=str(t)) for w, t in items]
    except (ValueError, TypeError):
        return []


def fragment_fields(fragment: Fragment) -> dict[str, Any]:
    """A fragment's own columns, trimmed to their limits (a fragment row's, and what a line row
    carries of them: `activities/line_rows.py`)."""
    return {
        "content": clip(fragment.content, CONTENT_MAX_BYTES),
        "theme": clip(fragment.theme, THEME_MAX_BYTES),
        "types": [clip(t, TYPE_MAX_BYTES) for t in fragment.types[:TYPES_MAX]],
        "created_at": float(fragment.created_at),
        "reinforced_at": float(fragment.reinforced_at),
        "strengthen_count": int(fragment.strengthen_count),
        "round_no": int(fragment.round_no),
        "thread_id": clip(fragment.thread_id, THREAD_ID_MAX_BYTES),
        "start_pos": int(fragment.start_pos),
        "end_pos": int(fragment.end_pos),
        "explicit": bool(fragment.explicit),
    }


def to_row(
    fragment: Fragment, vector: list[float], last_call_id: str = "", *, notes: bool = False
) -> dict[str, Any]:
    """A Milvus row for a fragment (text trimmed to the column limits); `notes`: the collection
    has the notes column."""
    if not is_valid_id(fragment.id):
        raise InvalidInputError(
            f"fragment id {fragment.id[:80]!r} must match [A-Za-z0-9_.:@-]{{1,128}}"
        )
    row = {
        "pk": fragment.id,
        "user_key": checked_user(fragment.user_id),
        "user_id": fragment.user_id,
        "vector": vector,
        **fragment_fields(fragment),
        "last_call_id": clip(last_call_id, CALL_ID_MAX_BYTES),
    }
    if notes:
        row[NOTES_FIELD] = notes_json(fragment.notes)
    return row


def to_fragment(row: dict[str, Any]) -> Fragment:
    """The Fragment a row holds (the vector and bookkeeping columns are dropped)."""
    return Fragment(
        id=row["pk"],
        user_id=row["user_id"],
        theme=row["theme"],
        types=list(row.get("types") or []),
        content=row["content"],
        created_at=float(row["created_at"]),
        reinforced_at=float(row["reinforced_at"]),
        strengthen_count=int(row["strengthen_count"]),
        round_no=int(row["round_no"]),
        thread_id=row.get("thread_id") or "",
        start_pos=int(row["start_pos"]),
        end_pos=int(row["end_pos"]),
        explicit=bool(row["explicit"]),
        notes=notes_of(row.get(NOTES_FIELD)),
    )
