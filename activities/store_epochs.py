"""The per-user forget epoch record that store writes are checked against (docs/ARCHITECTURE.md,
"Forget epochs").

The user workflow counts its whole-user forgets (`UserMemoryState.forget_epoch`) and every store
write it asks for carries that number. A forget moves the user's record here to its new epoch
before it deletes anything; a write is checked against the record before it is applied (under the
Milvus Lite write lock, activities/lite_writes.py) and once more after it (a production Milvus
takes no lock, so a forget can slip between the check and the write): a write that carries an
older epoch than the record is refused, or its rows are deleted again. So a write still inside
its store call when its caller gave up can no longer land after the forget.

The record is one Redis integer per user (`models.ids.epoch_key`), never lowered (a Lua max).
The same key tells agents the current epoch, which they stamp on what is said
(middleware/window.py); every publish of the read model keeps it at least at the context's
epoch, so a Redis that lost it has it back with the user's next publish. Calls are synchronous:
the check runs in the write's own thread, which cancelling the activity cannot stop.
"""

from __future__ import annotations

import redis

from mnemoflow.models.errors import StaleEpochError
from mnemoflow.models.ids import epoch_key

# KEYS[1] = the epoch key; ARGV[1] = an epoch. The stored epoch becomes the larger; returned.
# An absent key is written even at 0: agents tell "recorded 0" from "lost" (docs/ARCHITECTURE.md,
# "Forget epochs").
ADVANCE_LUA = """
local raw = redis.call('GET', KEYS[1])
local stored = tonumber(raw or '0') or 0
local wanted = tonumber(ARGV[1])
if wanted > stored or not raw then
  redis.call('SET', KEYS[1], ARGV[1])
  return wanted
end
return stored
"""


class StoreEpochs:
    """Read, advance and check users' forget epoch records in Redis (synchronous client)."""

    def __init__(self, url: str, prefix: str, *, timeout_s: float = 5.0) -> None:
        self.prefix = prefix
        self._redis = redis.Redis.from_url(
            url, retry=None, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._advance = self._redis.register_script(ADVANCE_LUA)
        #: Writes refused (before or after they were applied) since this process started.
        self.refused = 0

    def current(self, user_id: str) -> int:
        """The user's recorded epoch (0 when none was recorded)."""
        raw = self._redis.get(epoch_key(self.prefix, user_id))
        return int(raw) if raw is not None else 0

    def advance(self, user_id: str, epoch: int) -> int:
        """Move the user's record to `epoch` unless it is there already; the record after."""
        return int(self._advance(keys=[epoch_key(self.prefix, user_id)], args=[int(epoch)]))

    def check(self, user_id: str, epoch: int) -> None:
        """StaleEpochError when the user was forgotten after a write of `epoch` was asked for."""
        recorded = self.current(user_id)
        if recorded > epoch:
            self.refused += 1
            raise StaleEpochError(
                f"a store write of forget epoch {epoch} refused: the user was forgotten since "
                f"(epoch {recorded})"
            )

    def close(self) -> None:
        """Close the client's connections."""
        self._redis.close()
