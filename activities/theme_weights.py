"""Tuned weights per theme in Redis, for shape-5 rounds (docs/ARCHITECTURE.md, "The round").

The user workflow keeps the theme cache in its state, and a round of shape 4 gets all of it in
its input: up to 64 themes, 1.8 KB recorded twice in Temporal's history for every round. A
round of shape 5 gets none of it. Its LLM step asks this hash for the weights of the themes it
just sliced (one HMGET), tunes only those missing, and its store step writes the new ones (one
script), so the history records only the round's own themes.

Key: `<prefix>tuned:<user key>` (a hash of the user id); field: the first 16 bytes of the
SHA-256 of the theme key, in hex (no theme text in Redis); value: `<stamp>:<weights>`, the
Redis server's time in microseconds when the weights were stored and the weights as a JSON list
in TunedParams' field order. A user's hash keeps the `MAX_TUNED_THEMES` (64) most recently
stored themes, as the user workflow's own cache does: a model that names a new theme every
round would otherwise grow it without end. Like the read model it is a cache: a hash Redis lost
means the themes are tuned again (LLM calls, nothing wrong), and a lookup that fails is a miss.
Only the store step writes it, so a forget that waited for the round's writes leaves nothing
behind (`delete`, with the read model). The redis client is the read model's, without retries.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable

import redis.asyncio as aioredis

from mnemoflow.models.ids import user_key, validate_user_id
from mnemoflow.models.params import TunedParams
from mnemoflow.models.round_store import MAX_TUNED_THEMES, pack_params, unpack_params

log = logging.getLogger(__name__)


#: HSET the fields (ARGV[2], ARGV[3], ...) stamped with the server's time, then drop the oldest
#: stamps past ARGV[1] fields. Atomic, so two rounds' writes cannot both overshoot the bound.
_PUT_LUA = """
local now = redis.call('TIME')
local stamp = string.format('%d%06d', now[1], now[2])
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], stamp .. ':' .. ARGV[i + 1])
end
local keep = tonumber(ARGV[1])
if redis.call('HLEN', KEYS[1]) <= keep then
  return 0
end
local all = redis.call('HGETALL', KEYS[1])
local rows = {}
for i = 1, #all, 2 do
  local at = string.match(all[i + 1], '^(%d+):') or '0'
  rows[#rows + 1] = {at, all[i]}
end
table.sort(rows, function(a, b)
  if #a[1] ~= #b[1] then return #a[1] < #b[1] end
  return a[1] < b[1]
end)
local drop = #rows - keep
for i = 1, drop do
  redis.call('HDEL', KEYS[1], rows[i][2])
end
return drop
"""


def weights_key(prefix: str, user_id: str) -> str:
    """Redis key of a user's tuned weights."""
    return f"{prefix}tuned:{user_key(validate_user_id(user_id))}"


def _field(theme_key: str) -> str:
    return hashlib.sha256(theme_key.encode("utf-8")).digest()[:16].hex()


class ThemeWeights:
    """Read and write a user's tuned weights by theme key."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis = redis
        self.prefix = prefix
        self._put = redis.register_script(_PUT_LUA)

    async def get(self, user_id: str, keys: Iterable[str]) -> dict[str, TunedParams]:
        """The cached weights of these theme keys (those not cached are left out); a failed
        lookup is logged and answers nothing (the themes are tuned)."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        try:
            raw = await self._redis.hmget(
                weights_key(self.prefix, user_id), [_field(k) for k in wanted]
            )
        except Exception as exc:  # a cache: a miss costs LLM calls, never the round
            log.warning("theme weights unavailable (%d themes are tuned): %s", len(wanted), exc)
            return {}
        out: dict[str, TunedParams] = {}
        for key, value in zip(wanted, raw, strict=True):
            if value is None:
                continue
            try:
                text = value.decode() if isinstance(value, bytes) else str(value)
                out[key] = unpack_params(json.loads(text.partition(":")[2]))
            except (ValueError, TypeError):
                log.warning("unreadable theme weights in Redis; the theme is tuned again")
        return out

    async def put(
        self, user_id: str, tuned: dict[str, TunedParams], keep: int = MAX_TUNED_THEMES
    ) -> int:
        """Store these themes' weights, keeping the user's `keep` most recently stored; the
        number of older themes dropped (errors propagate: the store step retries)."""
        if not tuned:
            return 0
        args: list[str | int] = [keep]
        for key, params in tuned.items():
            args += [_field(key), json.dumps(pack_params(params))]
        return int(await self._put(keys=[weights_key(self.prefix, user_id)], args=args))

    async def delete(self, user_id: str) -> int:
        """Remove the user's weights (forgetting the user); the number of keys deleted."""
        return int(await self._redis.delete(weights_key(self.prefix, user_id)))
