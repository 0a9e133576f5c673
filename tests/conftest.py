"""Shared fixtures. Service fixtures live in tests/support and are re-exported here."""

import signal

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

# A suite started as a background job of a non-interactive shell (CI runners, `make test &`)
# inherits SIGINT ignored, and every process it starts inherits that too. Milvus Lite stops
# gracefully on SIGINT only (devstack.processes.start_milvus_lite): ignoring it, each stop ran
# into ManagedProcess.stop's 10 s timeout and ended in SIGKILL. Python's default, as in a
# terminal, so the servers the tests start get their stop signal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
