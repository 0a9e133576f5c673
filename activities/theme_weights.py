"""Tuned weights per theme in Redis, for shape-5 rounds (docs/ARCHITECTURE.md, "The round").

The user workflow keeps the theme cache in its state, and a round of shape 4 gets all of it in
its input: up to 64 themes, 1.8 KB recorded twice in Temporal's history for every round. A
round of shape 5 gets none of it. Its LLM step asks this hash for the weights of the themes it
just sliced (one HMGET), tunes only those missing, and its store step writes the new ones (one
HSET), so the history records only the round's own themes.

Key: `<prefix>tuned:<user key>` (a hash of the user id); field: the first 16 bytes of the
SHA-256 of the theme key, in hex (no theme text in Redis); value: the weights as a JSON list in
TunedParams' field order. Like the read model it is a cache: a hash Redis lost means the themes
are tuned again (LLM calls, nothing wrong), and a lookup that fails is a miss. Only the store
step writes it, so a forget that waited for the round's writes leaves nothing behind
(`delete`, with the read model). The redis client is the read model's, without retries.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable

import redis.asyncio as aioredis

from mnemoflow.models.ids import user_key, validate_user_id
from mnemoflow.models.params import TunedParams
from mnemoflow.models.round_store import pack_params, unpack_params

log = logging.getLogger(__name__)


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
                out[key] = unpack_params(json.loads(value))
            except (ValueError, TypeError):
                log.warning("unreadable theme weights in Redis; the theme is tuned again")
        return out

    async def put(self, user_id: str, tuned: dict[str, TunedParams]) -> None:
        """Store these themes' weights (errors propagate: the store step retries)."""
        if tuned:
            await self._redis.hset(
                weights_key(self.prefix, user_id),
                mapping={_field(k): json.dumps(pack_params(p)) for k, p in tuned.items()},
            )

    async def delete(self, user_id: str) -> int:
        """Remove the user's weights (forgetting the user); the number of keys deleted."""
        return int(await self._redis.delete(weights_key(self.prefix, user_id)))
