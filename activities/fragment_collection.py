"""The fragment collection in Milvus: its schema, vector index, search parameters, creation.

The schema's VARCHAR limits are in UTF-8 bytes (see activities.fragment_rows, which trims text to
them). The vector index is COSINE and of a type Milvus Lite rebuilds from disk after a restart
(HNSW by default; FLAT, AUTOINDEX, HNSW_SQ, IVF_FLAT and IVF_SQ8 also work).
"""

from __future__ import annotations

import logging
from typing import Any

from pymilvus import DataType, MilvusClient, MilvusException

from mnemoflow.activities.fragment_rows import (
    CALL_ID_MAX_BYTES,
    CONTENT_MAX_BYTES,
    NOTES_FIELD,
    NOTES_MAX_BYTES,
    PK_MAX_BYTES,
    THEME_MAX_BYTES,
    THREAD_ID_MAX_BYTES,
    TYPE_MAX_BYTES,
    TYPES_MAX,
    USER_ID_MAX_BYTES,
    USER_KEY_MAX_BYTES,
)

log = logging.getLogger(__name__)

# Milvus answers at most 16,384 rows per query or search (maxQueryResultWindow).
QUERY_WINDOW = 16_384


def build_schema(dim: int) -> Any:
    """The fragment collection: business-id primary key, user_key as the partition key."""
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=PK_MAX_BYTES)
    schema.add_field(
        "user_key", DataType.VARCHAR, max_length=USER_KEY_MAX_BYTES, is_partition_key=True
    )
    schema.add_field("user_id", DataType.VARCHAR, max_length=USER_ID_MAX_BYTES)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("content", DataType.VARCHAR, max_length=CONTENT_MAX_BYTES)
    schema.add_field("theme", DataType.VARCHAR, max_length=THEME_MAX_BYTES)
    schema.add_field(
        "types",
        DataType.ARRAY,
        element_type=DataType.VARCHAR,
        max_capacity=TYPES_MAX,
        max_length=TYPE_MAX_BYTES,
    )
    schema.add_field("created_at", DataType.DOUBLE)
    schema.add_field("reinforced_at", DataType.DOUBLE)
    schema.add_field("strengthen_count", DataType.INT64)
    schema.add_field("round_no", DataType.INT64)
    schema.add_field("thread_id", DataType.VARCHAR, max_length=THREAD_ID_MAX_BYTES)
    schema.add_field("start_pos", DataType.INT64)
    schema.add_field("end_pos", DataType.INT64)
    schema.add_field("explicit", DataType.BOOL)
    schema.add_field("last_call_id", DataType.VARCHAR, max_length=CALL_ID_MAX_BYTES)
    schema.add_field(NOTES_FIELD, DataType.VARCHAR, max_length=NOTES_MAX_BYTES, nullable=True)
    return schema


def index_params(index_type: str) -> Any:
    """The COSINE vector index (any type Milvus Lite reloads after a restart)."""
    params: dict[str, Any] = {}
    if "HNSW" in index_type:
        params = {"M": 16, "efConstruction": 200}
    elif index_type.startswith("IVF"):
        params = {"nlist": 128}
    index = MilvusClient.prepare_index_params()
    index.add_index("vector", index_type=index_type, metric_type="COSINE", params=params)
    # Every read filters on user_key: without a scalar index Milvus Lite scans every row of
    # every user (measured at 10k rows: 30-40 ms per filtered read, growing with the store).
    index.add_index("user_key", index_type="INVERTED")
    return index


def search_params(index_type: str, limit: int) -> dict[str, Any]:
    """Search parameters matching the index (HNSW needs ef >= limit)."""
    params: dict[str, Any] = {}
    if "HNSW" in index_type or index_type == "AUTOINDEX":
        params["ef"] = max(64, limit)
    elif index_type.startswith("IVF"):
        params["nprobe"] = 16
    return {"metric_type": "COSINE", "params": params}


def not_loaded(exc: MilvusException) -> bool:
    """True when Milvus refused because the collection is released (not loaded)."""
    message = str(getattr(exc, "message", exc)).lower()
    return exc.code == 101 or "not loaded" in message or "released" in message


def create_if_missing(
    client: MilvusClient, collection: str, dim: int, index_type: str, opts: dict[str, Any]
) -> bool:
    """Create the collection unless it exists; refuse one whose vectors have another dim.
    Returns whether it has the notes column: one created before the notes is given it where
    Milvus can add a column (a server; Milvus Lite cannot, and its rows go on without notes)."""
    if not client.has_collection(collection, **opts):
        schema, index = build_schema(dim), index_params(index_type)
        try:
            client.create_collection(collection, schema=schema, index_params=index, **opts)
        except MilvusException:
            # Another worker may have created it between our check and our create.
            if not client.has_collection(collection, **opts):
                raise
    fields = client.describe_collection(collection, **opts).get("fields", [])
    names = {field.get("name") for field in fields}
    if NOTES_FIELD not in names:
        try:
            client.add_collection_field(
                collection,
                NOTES_FIELD,
                DataType.VARCHAR,
                max_length=NOTES_MAX_BYTES,
                nullable=True,
                **opts,
            )
            names.add(NOTES_FIELD)
        except Exception as err:  # Milvus Lite: not implemented; an older server: refused
            log.warning(
                "collection %r has no notes column, lines stored without: %r", collection, err
            )
    for field in fields:
        if field.get("name") != "vector":
            continue
        found = int(field.get("params", {}).get("dim", dim))
        if found != dim:
            raise ValueError(
                f"collection {collection!r} holds {found}-dim vectors but the embedder "
                f"gives {dim}: use another collection"
            )
    return NOTES_FIELD in names


def query_all(
    client: MilvusClient, collection: str, expr: str, fields: list[str], opts: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every row matching `expr`: one query, or an iterator past Milvus's result window."""
    rows = list(
        client.query(collection, filter=expr, output_fields=fields, limit=QUERY_WINDOW, **opts)
    )
    if len(rows) < QUERY_WINDOW:
        return rows
    rows = []
    passed = {k: v for k, v in opts.items() if k in ("partition_names", "consistency_level")}
    it = client.query_iterator(
        collection, batch_size=1000, filter=expr, output_fields=fields, **passed
    )
    try:
        while batch := it.next():
            rows.extend(batch)
    finally:
        it.close()
    return rows


def nearest(
    client: MilvusClient,
    collection: str,
    vector: list[float],
    expr: str,
    limit: int,
    index_type: str,
    fields: list[str],
    opts: dict[str, Any],
) -> list[dict[str, Any]]:
    """The `limit` rows matching `expr` nearest to `vector` (each with a COSINE `distance`)."""
    found = nearest_each(client, collection, [vector], expr, limit, index_type, fields, opts)
    return found[0] if found else []


def nearest_each(
    client: MilvusClient,
    collection: str,
    vectors: list[list[float]],
    expr: str,
    limit: int,
    index_type: str,
    fields: list[str],
    opts: dict[str, Any],
) -> list[list[dict[str, Any]]]:
    """For each of `vectors`, the `limit` rows matching `expr` nearest to it: one search."""
    if not vectors:
        return []
    hits = client.search(
        collection,
        data=vectors,
        filter=expr,
        limit=limit,
        output_fields=fields,
        search_params=search_params(index_type, limit),
        anns_field="vector",
        **opts,
    )
    return [list(h) for h in hits] if hits else [[] for _ in vectors]
