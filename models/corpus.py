"""A user's corpus version and the corpus entry (README.md, "How memory is chosen for a call").

The worker moves a version counter in Redis on every write and delete of a user's fragments
(activities/search_corpus.py): by 1 for a write, by DELETE_STEP for a delete. The per-call
search reads it before it asks Milvus, so a search a forget overtook is run again
(`forgotten_since`); one that a round's writes overtook is not (what it found is still there).
A `CorpusEntry` is a fragment as an in-process index takes it (the LangGraph store's items,
middleware/store.py): what is injected, how often it was used, and its vector as little-endian
float16 in base64. `corpus_key` names the per-user Redis hash of such
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
    """Redis counter moved on every change of the user's corpus; its values never repeat for a
    user, across a forget too (a new counter starts at VERSION_START_PER_US times the server's
    time in microseconds)."""
    return f"{prefix}corpusv:{user_key(user_id)}"


#: How far a delete moves the version (a write moves it by 1): the deletes a version has seen are
#: its value // DELETE_STEP, so a reader tells a forget from a round (`forgotten_since`). 65,536
#: writes between two reads cross one step as well: the search then runs again, which is only a
#: wasted search.
DELETE_STEP = 1 << 16
#: A new counter starts at the server's time in microseconds times this, so it starts above
#: every value of the user's earlier counter unless that one saw more than one delete every 64
#: microseconds of its life (~1.9e18 now: a signed 64-bit counter lasts past the year 2250).
VERSION_START_PER_US = 1 << 10

# The start of a new counter, as an exact decimal: microseconds (below 2^53) times a power of 2
# is exact in Lua's doubles.
_START = f"""
local t = redis.call('TIME')
local start = string.format(
  '%.0f', (tonumber(t[1]) * 1000000 + tonumber(t[2])) * {VERSION_START_PER_US})
"""

#: Move the version counter KEYS[1] by ARGV[1] (1 when absent) and return it; a new counter
#: starts as `_START` says, never at the step (a version deleted with its corpus must never come
#: back). Effects replication (the default from Redis 5, the only mode in 7) lets a write
#: follow TIME.
BUMP_VERSION = f"""
if redis.replicate_commands then redis.replicate_commands() end
local step = tonumber(ARGV[1]) or 1
local v = redis.call('INCRBY', KEYS[1], step)
if v == step then
  {_START}
  redis.call('SET', KEYS[1], start)
  v = redis.call('INCRBY', KEYS[1], step)
end
return v
"""

#: The version counter KEYS[1], started as BUMP_VERSION starts it if it is absent; returns it.
#: A reader's mark: a forget deletes the key, so what was read before it can be told from after.
START_VERSION = f"""
if redis.replicate_commands then redis.replicate_commands() end
local v = redis.call('GET', KEYS[1])
if not v then
  {_START}
  v = start
  redis.call('SET', KEYS[1], v)
end
return v
"""


def corpus_version(raw: bytes | str | int | None) -> int:
    """The corpus version as read from Redis (an absent key, e.g. after a forget, is 0)."""
    return int(raw or 0)


def forgotten_since(read: int, now: int) -> bool:
    """Whether fragments may have been deleted between a search that read version `read` and
    a later read `now`: a delete moved it past a step, or a forget of the user removed the key
    (0), or it is a counter of another life. Writes alone never say so."""
    return read != now and (now == 0 or read == 0 or read // DELETE_STEP != now // DELETE_STEP)


def encode_vector(vector: Sequence[float]) -> str:
    """float16 little-endian, base64 (values beyond float16's range are clamped)."""
    clamped = [min(65504.0, max(-65504.0, float(v))) for v in vector]
    return base64.b64encode(struct.pack(f"<{len(clamped)}e", *clamped)).decode("ascii")


def decode_vector(text: str) -> list[float]:
    """The inverse of encode_vector ([] for '')."""
    raw = base64.b64decode(text.encode("ascii")) if text else b""
    return list(struct.unpack(f"<{len(raw) // 2}e", raw))
