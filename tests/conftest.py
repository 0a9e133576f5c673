"""Shared fixtures. Service fixtures live in tests/support and are re-exported here."""

from tests.support import milvus_index_wait
from tests.support.deepseek_emulator import emulator
from tests.support.reliability import reliability
from tests.support.services import milvus_uri, redis_url, unique_name
from tests.support.temporal import dev_env, time_skipping_env

__all__ = [
    "dev_env",
    "emulator",
    "milvus_uri",
    "redis_url",
    "reliability",
    "time_skipping_env",
    "unique_name",
]

# pymilvus sleeps 0.5 s before it first looks at a new index (about 1 s per collection made).
milvus_index_wait.install()
