"""Writes to a Milvus Lite server go one at a time (activities/lite_writes.py), and a delete is
read back (docs/ARCHITECTURE.md, "Stores and external parts").

Lite lost deletes that arrived with other writes over several connections: the row reported
deleted stayed stored, and a forgotten fragment came back in a two-worker test.
"""

from __future__ import annotations

import asyncio
import fcntl
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore, LostDeleteError
from mnemoflow.activities.lite_writes import lite_write, lock_path
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.ids import fragment_id
from tests.support.worker_process import ROOT

pytestmark = pytest.mark.integration

USER = "lite-writer"
ROUNDS = 80
CONNECTIONS = 7


def fragment(round_no: int, index: int) -> Fragment:
    """A distinct fragment of round `round_no`."""
    return Fragment(
        id=fragment_id(USER, round_no, index),
        user_id=USER,
        theme="errands",
        types=["fact"],
        content=f"Errand {round_no}-{index}: locker {round_no * 37 + index} opens on day {index}.",
        created_at=1_700_000_000.0 + round_no,
        reinforced_at=1_700_000_000.0 + round_no,
        round_no=round_no,
        thread_id="t",
        start_pos=index,
        end_pos=index + 1,
    )


@pytest.fixture
async def stores(milvus_uri: str, unique_name: str) -> AsyncIterator[list[FragmentStore]]:
    """Stores on one collection, each with a connection of its own (as worker processes and
    their activity threads have)."""
    made = [
        FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name)
        for _ in range(CONNECTIONS)
    ]
    for store in made:
        await store.ensure()
    try:
        yield made
    finally:
        await made[0].drop()
        for store in made:
            await store.close()


async def test_deletes_among_other_writes_all_take(stores: list[FragmentStore]) -> None:
    """Each round writes four fragments, then deletes them over four connections while two
    more write keepers. Before the writes were serialised, runs like this lost deletes (the row
    stayed) or failed a write with "current_seq is monotonic"."""
    writer, deleters, keepers = stores[0], stores[1:5], stores[5:]
    for n in range(1, ROUNDS + 1):
        await writer.upsert_vectors([fragment(n, i) for i in range(4)], query="which locker")
        deleted = await asyncio.gather(
            *(d.delete(USER, [fragment(n, i).id]) for i, d in enumerate(deleters)),
            *(k.upsert([fragment(10_000 + n, i)]) for i, k in enumerate(keepers)),
        )
        assert deleted[:4] == [1, 1, 1, 1], (n, deleted)
    left = await writer.all_for_user(USER)
    kept = [(10_000 + n, i) for n in range(1, ROUNDS + 1) for i in range(len(keepers))]
    assert sorted((f.round_no, int(f.id.rsplit("-f", 1)[1])) for f in left) == kept


async def test_a_delete_that_left_its_row_is_done_again(
    stores: list[FragmentStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores[0]
    await store.upsert([fragment(1, 0), fragment(1, 1)])
    client = store._connected()
    real = client.delete
    calls: list[Any] = []

    def lossy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("filter"))
        if len(calls) == 1:
            return {"delete_count": 1}  # reported, not done: what Lite did
        return real(*args, **kwargs)

    monkeypatch.setattr(client, "delete", lossy)
    assert await store.delete(USER, [fragment(1, 0).id]) == 1
    assert len(calls) == 2
    assert [f.id for f in await store.all_for_user(USER)] == [fragment(1, 1).id]
    # A delete that never takes ends in a retryable error, not in a success.
    monkeypatch.setattr(client, "delete", lambda *a, **k: {"delete_count": 1})
    with pytest.raises(LostDeleteError):
        await store.delete(USER, [fragment(1, 1).id])
    with pytest.raises(LostDeleteError):
        await store.delete_user(USER)


HOLDER = """
import sys
from mnemoflow.activities.lite_writes import lite_write
with lite_write(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def _free(uri: str) -> bool:
    """True when nobody holds the server's write lock (tried without waiting)."""
    with open(lock_path(uri), "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh, fcntl.LOCK_UN)
        return True


def test_the_write_lock_holds_across_processes(unique_name: str) -> None:
    uri = f"http://127.0.0.1:1/{unique_name}"
    other = f"http://127.0.0.1:2/{unique_name}"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, uri],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "held"
        assert not _free(uri)  # another process's writer waits
        assert _free(other)  # another server's writers do not
        with lite_write(other):
            pass
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        assert proc.wait(timeout=30) == 0
        assert _free(uri)  # released as the process left the block
        with lite_write(uri):
            assert not _free(uri)  # this process holds it now
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for name in (uri, other):
            lock_path(name).unlink(missing_ok=True)


async def test_a_write_called_off_while_it_queued_for_the_lock_never_lands(
    stores: list[FragmentStore], milvus_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local activity that timed out while its write queued for the lock: the activity's task
    is cancelled, but its thread goes on. Written late, the row could undo a forget that ran
    meanwhile (a probe found a whole forgotten round back in Milvus so)."""
    from mnemoflow.activities import fragment_store

    store = stores[0]
    await store.upsert([fragment(1, 0)])  # connected, and known to be Lite
    queued, finished = threading.Event(), threading.Event()
    real = fragment_store.lite_write

    @contextmanager
    def watched(uri: str) -> Iterator[None]:
        queued.set()
        try:
            with real(uri):
                yield
        finally:
            finished.set()

    monkeypatch.setattr(fragment_store, "lite_write", watched)
    release = threading.Event()
    holding = threading.Event()

    def hold() -> None:
        with real(milvus_uri):
            holding.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert await asyncio.to_thread(holding.wait, 30)
        late = asyncio.create_task(store.upsert([fragment(2, 0)]))
        assert await asyncio.to_thread(queued.wait, 30)  # its thread waits for the lock
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
    finally:
        release.set()
        await asyncio.to_thread(holder.join, 30)
    assert await asyncio.to_thread(finished.wait, 30)  # the thread got the lock, and left
    assert [f.id for f in await store.all_for_user(USER)] == [fragment(1, 0).id]


def test_without_a_writable_temp_dir_the_thread_lock_still_serialises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only root filesystem (the chart sets one): no file lock, writes still go on."""
    from mnemoflow.activities import lite_writes

    monkeypatch.setattr(lite_writes, "lock_path", lambda uri: tmp_path / "missing" / "x.lock")
    uri = f"http://127.0.0.1:3/{tmp_path.name}"
    with lite_write(uri):
        local, fd = lite_writes._lock_of(uri)
        assert fd is None and local.locked()
    assert "thread lock only" in caplog.text
