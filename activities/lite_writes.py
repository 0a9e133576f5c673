"""One write at a time to a Milvus Lite server (docs/ARCHITECTURE.md, "Stores").

Milvus Lite applies writes that arrive at once over several connections unsafely. Measured on
this project's dev stack (three connections deleting, upserting and flushing one user's rows,
500 rounds): 7 of 1,000 deletes were lost although each reported its row deleted (the row was
still there right after, or came back later), and writes failed with "current_seq is monotonic".
With the writes serialised, none in 600 rounds. A production Milvus has no such limit; Lite
serves one machine (a local file, or `milvus-lite server` on loopback), so a lock on that
machine covers every writer: a thread lock per server in the process, and a file lock across
the worker processes of the dev stack.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux: the thread lock alone
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
_guard = threading.Lock()
#: (process id, server) -> the thread lock and the open lock file. By process id: a forked child
#: opens its own file, since a lock taken on an inherited descriptor would be shared with the
#: parent.
_locks: dict[tuple[int, str], tuple[threading.Lock, int | None]] = {}


def _key(uri: str) -> str:
    return uri.strip().rstrip("/")


def lock_path(uri: str) -> Path:
    """The file whose lock stands for writing to the Lite server at `uri`."""
    digest = hashlib.sha256(_key(uri).encode("utf-8")).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"mnemoflow-milvus-lite-{digest}.lock"


def _lock_of(uri: str) -> tuple[threading.Lock, int | None]:
    key = (os.getpid(), _key(uri))
    with _guard:
        found = _locks.get(key)
        if found is None:
            fd = None
            if fcntl is not None:
                try:
                    fd = os.open(lock_path(uri), os.O_RDWR | os.O_CREAT, 0o666)
                except OSError as exc:  # a read-only temp dir: this process's writers only
                    log.warning("no file lock for Milvus Lite writes (%s): thread lock only", exc)
            found = _locks[key] = (threading.Lock(), fd)
        return found


@contextmanager
def lite_write(uri: str) -> Iterator[None]:
    """Hold the write lock of the Milvus Lite server at `uri` (this process and the others)."""
    local, fd = _lock_of(uri)
    with local:
        if fd is None or fcntl is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
