"""The line collection in Milvus: one row per line of every stored fragment, the per-call
search's candidates (docs/ARCHITECTURE.md, "Read path"; README.md, "How memory is chosen for a
call").

A row holds the line verbatim, its analysed terms (`memory.lines.indexed_terms`, which a BM25
function turns into a sparse field), its fragment's vector (the dense side of the hybrid
search), and where the line stands: its fragment's id and its position there. The user key
is the partition key, as in the fragment collection.
The fragment store writes and deletes these rows in the same call as the fragment's own row
(`activities/fragment_store.py`), so a forgotten fragment's lines go with it; the reader checks
every candidate against the fragment collection anyway, which stays the one authority.

`line_rows` is the one place that says what a line indexes: what else a line should be found
by (dates, enrichment terms) goes into its `terms` here.
"""

from __future__ import annotations

from typing import Any

from pymilvus import DataType, Function, FunctionType, MilvusClient

from mnemoflow.activities.fragment_rows import (
    CONTENT_MAX_BYTES,
    PK_MAX_BYTES,
    USER_KEY_MAX_BYTES,
    checked_user,
    clip,
)
from mnemoflow.memory.lines import indexed_terms, line_id, line_texts
from mnemoflow.models.fragments import Fragment

#: The line collection of a fragment collection is named after it.
LINES_SUFFIX = "_lines"
LINE_PK_MAX_BYTES = PK_MAX_BYTES + 16
#: The BM25 field's analyzer: the terms are hex digests already (`memory.lines`), so any
#: engine's `standard` tokenizer splits them exactly at the spaces.
ANALYZER = {"tokenizer": "standard"}
#: BM25's parameters, as the in-process search had them (`memory.search.BM25_K1`, `BM25_B`).
BM25_PARAMS = {"bm25_k1": 1.2, "bm25_b": 0.75}


def lines_collection(fragments_collection: str) -> str:
    """The line collection that goes with a fragment collection."""
    return f"{fragments_collection}{LINES_SUFFIX}"


def build_line_schema(dim: int) -> Any:
    """One row per line; BM25 over `terms` into `sparse`; `user_key` the partition key."""
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=LINE_PK_MAX_BYTES)
    schema.add_field(
        "user_key", DataType.VARCHAR, max_length=USER_KEY_MAX_BYTES, is_partition_key=True
    )
    schema.add_field("fragment_id", DataType.VARCHAR, max_length=PK_MAX_BYTES)
    schema.add_field("position", DataType.INT64)
    schema.add_field("text", DataType.VARCHAR, max_length=CONTENT_MAX_BYTES)
    schema.add_field(
        "terms",
        DataType.VARCHAR,
        max_length=CONTENT_MAX_BYTES,
        enable_analyzer=True,
        analyzer_params=ANALYZER,
    )
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_function(
        Function(
            name="terms_bm25",
            function_type=FunctionType.BM25,
            input_field_names=["terms"],
            output_field_names=["sparse"],
        )
    )
    return schema


def line_index_params(vector_index: Any) -> Any:
    """The sparse BM25 index, the COSINE vector index and the scalar indexes reads filter on."""
    vector_index.add_index(
        "sparse",
        index_type="SPARSE_INVERTED_INDEX",
        metric_type="BM25",
        params=BM25_PARAMS,
    )
    vector_index.add_index("fragment_id", index_type="INVERTED")
    return vector_index


def line_rows(fragment: Fragment, vector: list[float]) -> list[dict[str, Any]]:
    """The rows of a fragment's lines (text trimmed to the column limits)."""
    key = checked_user(fragment.user_id)
    rows = []
    for n, text in enumerate(line_texts(fragment.content)):
        rows.append(
            {
                "pk": line_id(fragment.id, n),
                "user_key": key,
                "fragment_id": fragment.id,
                "position": n,
                "text": clip(text, CONTENT_MAX_BYTES),
                "terms": clip(indexed_terms(text), CONTENT_MAX_BYTES),
                "vector": vector,
            }
        )
    return rows
