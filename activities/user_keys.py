"""The forget saga's key steps: retire the user's data keys, then erase them (crypto-shredding).

The keys themselves are made and used by the payload codec (`worker.data_keys`); these
activities only change the Redis hash that holds them (`models.ids.data_key_name`), so they
need no key material. `retire_user_key` removes the hash's `active` field: the codec's next
encode of that user makes a new generation. `destroy_user_key` deletes the given generations
(or the whole hash); once it returned, no payload sealed with them can be decrypted: not by
the codec server, not by a worker replaying a history, not from a copy of Temporal's database.
Both are idempotent: a retry finds the same generations, or nothing left to delete (0).
"""

from __future__ import annotations

from collections.abc import Callable

import redis.asyncio as aioredis
from temporalio import activity
from temporalio.exceptions import ApplicationError

from mnemoflow.models.errors import InvalidInputError
from mnemoflow.models.ids import data_key_name, data_key_user, validate_user_id
from mnemoflow.models.user_keys import (
    DESTROY_USER_KEY,
    RETIRE_USER_KEY,
    DestroyUserKeyInput,
    DestroyUserKeyOutput,
    RetireUserKeyInput,
    RetireUserKeyOutput,
)

# KEYS[1] = the user's hash. Drops `active` and returns every generation field.
_RETIRE_LUA = """
redis.call('HDEL', KEYS[1], 'active')
return redis.call('HKEYS', KEYS[1])
"""


class UserKeyActivities:
    """`destroy_user_key`, bound to the Redis of the data keys (None: per-user keys are off)."""

    def __init__(
        self,
        redis: aioredis.Redis | None,
        prefix: str = "mnemoflow:",
        on_destroyed: Callable[[str], None] | None = None,
    ) -> None:
        """`on_destroyed(data_key_user)` drops this process's cached copies of the keys (the
        payload codec's `forget_cached`), so this process stops using them at once; other
        processes ask Redis on every decode and stop at once too (docs/PRIVACY.md)."""
        self.redis = redis
        self.prefix = prefix
        self.on_destroyed = on_destroyed

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str,
        on_destroyed: Callable[[str], None] | None = None,
        *,
        timeout_s: float = 2.0,
    ) -> UserKeyActivities:
        """On a new client for `url`, without the client's own retries (Temporal retries)."""
        client = aioredis.Redis.from_url(
            url, retry=None, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        return cls(client, prefix, on_destroyed)

    async def close(self) -> None:
        """Close the client's connections."""
        if self.redis is not None:
            await self.redis.aclose()

    @activity.defn(name=RETIRE_USER_KEY)
    async def retire_user_key(self, inp: RetireUserKeyInput) -> RetireUserKeyOutput:
        """Make the user's next payloads take a new generation; the generations there were."""
        user_id = _checked(inp.user_id)
        if self.redis is None:
            return RetireUserKeyOutput(generations=[])
        name = data_key_name(self.prefix, data_key_user(user_id))
        fields = await self.redis.eval(_RETIRE_LUA, 1, name)  # type: ignore[misc]
        return RetireUserKeyOutput(generations=sorted(_generations(fields)))

    @activity.defn(name=DESTROY_USER_KEY)
    async def destroy_user_key(self, inp: DestroyUserKeyInput) -> DestroyUserKeyOutput:
        """Erase the given generations of the user's data key (every one when None); how many
        there were."""
        user_id = _checked(inp.user_id)
        if self.redis is None:
            return DestroyUserKeyOutput(destroyed=0)
        data_user = data_key_user(user_id)
        name = data_key_name(self.prefix, data_user)
        if inp.generations is not None:
            fields = [f"g:{g}" for g in inp.generations]
            destroyed = int(await self.redis.hdel(name, *fields)) if fields else 0  # type: ignore[misc]
        else:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hkeys(name)
                pipe.delete(name)
                found, _ = await pipe.execute()
            destroyed = len(_generations(found))
        if self.on_destroyed is not None:
            self.on_destroyed(data_user)
        return DestroyUserKeyOutput(destroyed=destroyed)


def _checked(user_id: str) -> str:
    try:
        return validate_user_id(user_id)
    except ValueError as exc:
        err = InvalidInputError(str(exc))
        raise ApplicationError(str(err), type=err.type, non_retryable=True) from exc


def _generations(fields: list[bytes | str]) -> list[str]:
    """The generation ids among a data key hash's fields (`g:<generation>`)."""
    names = [f.decode() if isinstance(f, bytes) else f for f in fields]
    return [n[2:] for n in names if n.startswith("g:")]
