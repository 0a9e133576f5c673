"""Store writes checked against the user's forget epoch (docs/ARCHITECTURE.md, "Forget epochs"),
on Milvus Lite and a real redis-server: a write asked for before a forget is refused where the
data lives, also when the forget slips in between the check and the write (a production Milvus
takes no write lock), and also when its caller has long given up."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymilvus import MilvusClient

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.store_epochs import StoreEpochs
from mnemoflow.models.errors import StaleEpochError
from tests.activities.test_fragment_store import frag


class HeldStore(FragmentStore):
    """A store whose next write waits inside its store call (after the epoch check) until the
    test releases it, in the write's own thread, as a slow pymilvus call would."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.armed = False

    def _write(self, client: MilvusClient, rows: list[dict[str, Any]], written: Any) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(60), "never released"
        super()._write(client, rows, written)


@pytest.fixture
async def held(
    milvus_uri: str, redis_url: str, unique_name: str
) -> AsyncIterator[tuple[HeldStore, StoreEpochs]]:
    epochs = StoreEpochs(redis_url, f"test:{uuid.uuid4().hex[:8]}:")
    store = HeldStore(milvus_uri, HashingEmbeddings(), collection=unique_name, epochs=epochs)
    await store.ensure()
    try:
        yield store, epochs
    finally:
        store.release.set()
        await store.drop()
        await store.close()
        epochs.close()


async def test_a_write_of_an_older_epoch_is_refused_before_it_is_applied(
    held: tuple[HeldStore, StoreEpochs],
) -> None:
    store, epochs = held
    user = f"ep-{uuid.uuid4().hex[:6]}"
    assert await store.upsert([frag(user, 0, "order 1 shipped")], epoch=0) == [frag(user, 0, "").id]
    assert await store.delete_user(user, epoch=1) == 1  # the forget: record first, then delete
    with pytest.raises(StaleEpochError):
        await store.upsert([frag(user, 1, "order 2 shipped")], epoch=0)
    assert await store.count(user) == 0 and epochs.refused == 1
    # Written under the new epoch, and under none (a caller from before epochs): stored.
    await store.upsert([frag(user, 2, "order 3 shipped")], epoch=1)
    await store.upsert([frag(user, 3, "order 4 shipped")])
    assert await store.count(user) == 2
    assert epochs.current(user) == 1 and epochs.advance(user, 0) == 1  # never lowered


async def test_a_forget_between_the_check_and_the_write_takes_the_rows_out_again(
    held: tuple[HeldStore, StoreEpochs],
) -> None:
    """As on a production Milvus (no write lock, `_lite` False): the write passed its check,
    then waits inside its store call while the forget records its epoch and deletes; it lands
    after the forget and then finds the record moved, and deletes its own rows. Counted after
    the writer ended."""
    store, _ = held
    store._lite = False  # a Milvus server: writes take no lock
    user = f"gap-{uuid.uuid4().hex[:6]}"
    store.armed = True
    writer = asyncio.create_task(store.upsert([frag(user, 0, "passport X7731942")], epoch=0))
    assert await asyncio.to_thread(store.entered.wait, 60)
    assert await store.delete_user(user, epoch=1) == 0  # the forget, while the write is held
    store.release.set()
    with pytest.raises(StaleEpochError):
        await asyncio.wait_for(writer, 60)
    assert await store.count(user) == 0


async def test_a_write_whose_caller_gave_up_is_still_checked(
    held: tuple[HeldStore, StoreEpochs],
) -> None:
    """The caller is cancelled (an activity's timeout) while its write is held inside the store
    call; the forget comes; the write goes on in its thread after the caller left and finds the
    record moved. Counted once the write's thread ended."""
    store, _ = held
    store._lite = False
    user = f"gone-{uuid.uuid4().hex[:6]}"
    store.armed = True
    writer = asyncio.create_task(store.upsert([frag(user, 0, "door code 4471-XQ")], epoch=0))
    assert await asyncio.to_thread(store.entered.wait, 60)
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    await store.delete_user(user, epoch=1)
    store.release.set()
    for _ in range(600):  # the thread ends: its re-check deleted what it wrote
        if store.epochs is not None and store.epochs.refused >= 1:
            break
        await asyncio.sleep(0.05)
    assert store.epochs is not None and store.epochs.refused == 1
    assert await store.count(user) == 0
