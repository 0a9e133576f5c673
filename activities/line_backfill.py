"""Line rows for fragments stored before the line collection existed (docs/ARCHITECTURE.md,
"Read path": the per-call search only finds fragments that have line rows).

`backfill_lines` walks the fragment collection in batches and writes the line rows of every
fragment that has none, from the row itself (its content and notes: a line row carries no
vector, and nothing is embedded). It never writes a fragment row, so it cannot bring back a
forgotten fragment.

It runs beside live workers, so each batch is checked after its write, against the fragment
collection (strongly consistent), which stays the one authority:

- a fragment forgotten while its lines were being written has them deleted again;
- a fragment stored again meanwhile (a forget of one of its lines rewrites it) gets the lines
  of the version stored now, and the check repeats until what was written is what is stored.

A forget that comes after the check deletes the lines itself (`FragmentStore.delete`), as does
a later store of the fragment. A forget made meanwhile by a worker of the earlier version
(a rolling upgrade runs both) deletes the fragment's row and its lines in the earlier
collection only: so the backfill ends by deleting every line row whose fragment row is gone
(`orphan_lines_deleted`; a line row is written after its fragment's row and deleted before it,
so such a row is never one being written). Run after the rollout, it leaves none. Running it
twice is harmless: the second run finds every fragment with lines and writes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from pymilvus import MilvusClient

from mnemoflow.activities.fragment_rows import ids_filter, to_fragment
from mnemoflow.activities.fragment_store import FragmentStore, _lines_of
from mnemoflow.activities.line_rows import fragment_json
from mnemoflow.memory.lines import line_texts
from mnemoflow.models.fragments import Fragment

#: Fragment rows read per batch (without their vectors: a few hundred bytes each).
BATCH = 500
#: Rounds of write-then-check for one batch before it is reported as unsettled.
CHECKS = 5
_ALL = 'pk != ""'


@dataclass
class BackfillReport:
    """What a backfill did."""

    fragments_seen: int = 0
    fragments_backfilled: int = 0
    lines_written: int = 0
    users: int = 0
    forgotten_meanwhile: int = 0
    rewritten_meanwhile: int = 0
    orphan_lines_deleted: int = 0
    unsettled: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _signature(fragment: Fragment) -> tuple[str, str]:
    """What a fragment's line rows are made of: what its `fragment` column holds (a
    reinforcement meanwhile changes it too)."""
    return fragment_json(fragment), "".join(n.model_dump_json() for n in fragment.notes)


async def backfill_lines(store: FragmentStore, *, batch: int = BATCH) -> BackfillReport:
    """Write the missing line rows of every stored fragment (module docstring)."""
    if store.lines_collection is None:
        raise ValueError("the store has no line collection: build it with lines=True")
    if batch < 1:
        raise ValueError("batch must be >= 1")
    await store.ensure()
    report = BackfillReport()
    users: set[str] = set()
    fields = [*store._scalar_fields, "user_key"]
    rows_of = _batches(store, store.collection, fields, batch)
    while True:
        rows = await asyncio.to_thread(next, rows_of, None)
        if rows is None:
            break
        report.fragments_seen += len(rows)
        by_user: dict[str, list[Fragment]] = {}
        for row in rows:
            by_user.setdefault(str(row["user_key"]), []).append(to_fragment(row))
        for key, fragments in by_user.items():
            users.add(key)
            await _user_batch(store, key, fragments, report)
    report.users = len(users)
    await _sweep_orphans(store, batch, report)
    return report


async def _sweep_orphans(store: FragmentStore, batch: int, report: BackfillReport) -> None:
    """Delete the line rows whose fragment row is gone (module docstring)."""
    name = store.lines_collection
    assert name is not None
    lines_of = _batches(store, name, ["user_key", "fragment_id"], batch)
    while True:
        rows = await asyncio.to_thread(next, lines_of, None)
        if rows is None:
            break
        by_user: dict[str, set[str]] = {}
        for row in rows:
            by_user.setdefault(str(row["user_key"]), set()).add(str(row["fragment_id"]))
        for key, ids in by_user.items():
            wanted = sorted(ids)
            stored = await _stored(store, key, wanted)
            gone = [i for i in wanted if i not in stored]
            if gone:
                report.orphan_lines_deleted += await store._lines_left(key, gone)
                await store._run_write(partial(_delete, store, expr=_lines_of(key, gone)))


def _batches(
    store: FragmentStore, collection: str, fields: list[str], batch: int
) -> Iterator[list[dict[str, Any]]]:
    """Every row of `collection`, `batch` at a time (one iterator over the whole collection)."""
    it = store._connected().query_iterator(
        collection, batch_size=batch, filter=_ALL, output_fields=fields, timeout=60
    )
    try:
        while rows := it.next():
            yield rows
    finally:
        it.close()


async def _user_batch(
    store: FragmentStore,
    key: str,
    fragments: list[Fragment],
    report: BackfillReport,
) -> None:
    """One user's fragments of a batch: lines for those that have none, then checked."""
    have = await _with_lines(store, key, [f.id for f in fragments])
    todo = [f for f in fragments if f.id not in have]
    if not todo:
        return
    first = True
    for _ in range(CHECKS):
        await store._run_write(partial(_write, store, fragments=todo))
        if first:
            report.fragments_backfilled += len(todo)
            first = False
        report.lines_written += sum(len(line_texts(f.content)) for f in todo)
        stored = await _stored(store, key, [f.id for f in todo])
        gone = [f.id for f in todo if f.id not in stored]
        if gone:
            report.forgotten_meanwhile += len(gone)
            expr = _lines_of(key, gone)
            await store._run_write(partial(_delete, store, expr=expr))
        changed = [
            stored[f.id]
            for f in todo
            if f.id in stored and _signature(stored[f.id]) != _signature(f)
        ]
        if not changed:
            return
        report.rewritten_meanwhile += len(changed)
        todo = changed
    report.unsettled.extend(f.id for f in todo)


async def _with_lines(store: FragmentStore, key: str, ids: list[str]) -> set[str]:
    """Which of the fragments `ids` have line rows already."""
    name, expr, opts = store.lines_collection, _lines_of(key, ids), store._read_opts(key)
    assert name is not None
    rows = await store._run(
        lambda c: c.query(name, filter=expr, output_fields=["fragment_id"], **opts)
    )
    return {str(r["fragment_id"]) for r in rows}


async def _stored(store: FragmentStore, key: str, ids: list[str]) -> dict[str, Fragment]:
    """The fragments among `ids` as stored now (strongly consistent)."""
    expr, opts = ids_filter(key, ids), store._read_opts(key)
    fields = store._scalar_fields
    rows = await store._run(
        lambda c: c.query(store.collection, filter=expr, output_fields=fields, **opts)
    )
    return {str(r["pk"]): to_fragment(r) for r in rows}


def _write(store: FragmentStore, client: MilvusClient, *, fragments: list[Fragment]) -> None:
    store._write_lines(client, fragments)
    store._flush(client, len(fragments))


def _delete(store: FragmentStore, client: MilvusClient, *, expr: str) -> None:
    store._delete_lines(client, expr)
    store._flush(client)
