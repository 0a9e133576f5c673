"""A user's corpus version and the corpus entry (README.md, "How memory is chosen for a call").

The worker moves a version counter in Redis on every write and delete of a user's fragments
(activities/search_corpus.py); the per-call search reads it before it asks Milvus, so a search
a forget overtook is run again. A `CorpusEntry` is a fragment as an in-process index takes it
(the LangGraph store's items, middleware/store.py): what is injected, how often it was used, and
its vector as little-endian float16 in base64. `corpus_key` names the per-user Redis hash of such
entries that versions before the line collection kept; nothing writes it now, and forgetting a
user or `mnemoflow backfill-lines` deletes what is left of it.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence

from pydantic import Field

from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.fragments import Fragment, LineNote
from mnemoflow.models.ids import user_key


class CorpusEntry(ContextFragment):
    """One searchable fragment: what is injected (a ContextFragment), how often it was used,
    and its vector."""

    strengthen_count: int = 0
    vector: str = Field("", description="base64 of little-endian float16 values; '' for none")
    notes: list[LineNote] = Field(
        default_factory=list, description="per line: dates shown, terms indexed ([]: none)"
    )

    @classmethod
    def of_stored(cls, fragment: Fragment, vector: Sequence[float]) -> CorpusEntry:
        """The corpus entry of a stored fragment and its embedding."""
        published = ContextFragment.of(fragment).model_dump(exclude={"score"})
        return cls(
            **published,
            strengthen_count=fragment.strengthen_count,
            vector=encode_vector(vector),
            notes=list(fragment.notes),
        )

    def injected(self) -> ContextFragment:
        """The fragment as the prompt gets it."""
        return ContextFragment.model_validate(
            self.model_dump(include=set(ContextFragment.model_fields))
        )


def corpus_key(prefix: str, user_id: str) -> str:
    """Redis hash of the user's corpus entries."""
    return f"{prefix}corpus:{user_key(user_id)}"


def corpus_version_key(prefix: str, user_id: str) -> str:
    """Redis counter bumped on every change of the user's corpus; its values never repeat for a
    user, across a forget too (a new counter starts at the server's time in microseconds)."""
    return f"{prefix}corpusv:{user_key(user_id)}"


#: Bump the version counter KEYS[1] and return it; a new counter starts at the server's time in
#: microseconds, never at 1 (a version deleted with its corpus must never come back). Effects
#: replication (the default from Redis 5, the only mode in 7) lets a write follow TIME.
BUMP_VERSION = """
if redis.replicate_commands then redis.replicate_commands() end
local v = redis.call('INCR', KEYS[1])
if v == 1 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[1], t[1] .. string.format('%06d', tonumber(t[2])))
  v = redis.call('INCR', KEYS[1])
end
return v
"""

#: The version counter KEYS[1], started as BUMP_VERSION starts it if it is absent; returns it.
#: A reader's mark: a forget deletes the key, so what was read before it can be told from after.
START_VERSION = """
if redis.replicate_commands then redis.replicate_commands() end
local v = redis.call('GET', KEYS[1])
if not v then
  local t = redis.call('TIME')
  v = t[1] .. string.format('%06d', tonumber(t[2]))
  redis.call('SET', KEYS[1], v)
end
return v
"""


def corpus_version(raw: bytes | str | int | None) -> int:
    """The corpus version as read from Redis (an absent key, e.g. after a forget, is 0)."""
    return int(raw or 0)


def encode_vector(vector: Sequence[float]) -> str:
    """float16 little-endian, base64 (values beyond float16's range are clamped)."""
    clamped = [min(65504.0, max(-65504.0, float(v))) for v in vector]
    return base64.b64encode(struct.pack(f"<{len(clamped)}e", *clamped)).decode("ascii")


def decode_vector(text: str) -> list[float]:
    """The inverse of encode_vector ([] for '')."""
    raw = base64.b64decode(text.encode("ascii")) if text else b""
    return list(struct.unpack(f"<{len(raw) // 2}e", raw))
