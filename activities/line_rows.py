"""The line collection in Milvus: one row per line of every stored fragment, the per-call
search's candidates (docs/ARCHITECTURE.md, "Read path"; README.md, "How memory is chosen for a
call").

A row holds its line's analysed terms (`memory.lines.indexed_terms`, which a BM25
function turns into a sparse field), where the line stands (its fragment's id and its position
there), and the fragment fields a search ranks and injects by (FRAGMENT_FIELDS: content, theme,
types, when it was said, how often it was drawn on, its thread and span; one JSON column); the
line itself is the content's line at that position. The user key is the partition key, as in
the fragment collection.

No vector: every line of a fragment had its fragment's vector, so the dense side of a call's
search reads the fragment collection, one row per fragment, and each fragment found stands for
its lines (`middleware/milvus_search.py`). Milvus Lite materialises every column of every hit,
the 512-d vector included; without it on the line rows, a 600-line user's search cost the Lite
server ~25 % less CPU and a line write ~half (docs/PERFORMANCE.md, "Hot path").

The fragment store writes these rows with every write of the fragment's own row, a
reinforcement included, after it (so a line row never shows a fragment not stored yet), and
deletes them before the fragment's row, checking that none is left
(`activities/fragment_store.py`): a forgotten fragment leaves the search in the step that
deletes it. Lines are upserted in place (a search running meanwhile sees the old row or the new
one, never none); only positions past a shortened fragment's end are deleted.

The content is repeated on each line of a fragment (a line row of a 3-line LoCoMo fragment:
~300 bytes of content); docs/CAPACITY.md counts it.

`line_rows` is the one place that says what a line indexes: what else a line should be found
by (dates, enrichment terms) goes into its `terms` here.
"""

from __future__ import annotations

import json
from typing import Any

from pymilvus import DataType, Function, FunctionType, MilvusClient

from mnemoflow.activities.fragment_rows import (
    CONTENT_MAX_BYTES,
    PK_MAX_BYTES,
    USER_KEY_MAX_BYTES,
    checked_user,
    clip,
    fragment_fields,
)
from mnemoflow.memory.lines import LINES_SUFFIX, indexed_terms, line_id, line_texts
from mnemoflow.models.fragments import Fragment

#: The line collections earlier versions named after a fragment collection (the current one:
#: `memory.lines.LINES_SUFFIX`), with the fields that tell them from a collection someone else
#: named so: "_lines" carried no fragment fields, "_lines2" its fragment's vector on every line.
#: Each is dropped once the current one is backfilled (`worker.app.migrate_to_lines`).
EARLIER_LINES_SUFFIXES = ("_lines", "_lines2")
_EARLIER = frozenset({"pk", "user_key", "fragment_id", "position", "terms", "sparse", "vector"})
#: Per earlier suffix: the fields its collection has, and one it has not.
EARLIER_LINE_FIELDS: dict[str, tuple[frozenset[str], str | None]] = {
    "_lines": (_EARLIER, "fragment"),
    "_lines2": (_EARLIER | {"fragment"}, None),
}
LINE_PK_MAX_BYTES = PK_MAX_BYTES + 16
#: The `fragment` column's limit: Milvus's VARCHAR ceiling, as the fragment row's content.
FRAGMENT_MAX_BYTES = CONTENT_MAX_BYTES
#: The BM25 field's analyzer: the terms are hex digests already (`memory.lines`), so any
#: engine's `standard` tokenizer splits them exactly at the spaces.
ANALYZER = {"tokenizer": "standard"}
#: BM25's parameters, as the in-process search had them (`memory.search.BM25_K1`, `BM25_B`).
BM25_PARAMS = {"bm25_k1": 1.2, "bm25_b": 0.75}


def lines_collection(fragments_collection: str) -> str:
    """The line collection that goes with a fragment collection."""
    return f"{fragments_collection}{LINES_SUFFIX}"


def earlier_lines_collections(fragments_collection: str) -> list[str]:
    """The line collections earlier versions kept for a fragment collection."""
    return [f"{fragments_collection}{suffix}" for suffix in EARLIER_LINES_SUFFIXES]


def is_earlier_lines(name: str, fields: set[str]) -> bool:
    """Whether a collection named as an earlier line collection has that version's fields (one
    of another shape is not ours to drop)."""
    for suffix in EARLIER_LINES_SUFFIXES:
        if name.endswith(suffix):
            has, lacks = EARLIER_LINE_FIELDS[suffix]
            return has <= fields and (lacks is None or lacks not in fields)
    return False


#: The fragment's fields each line row carries in its `fragment` column, as JSON (what
#: `middleware/milvus_search.py` reads): one column, because Milvus Lite materialises every
#: column of every hit (eight columns cost ~7 ms more per search than this one, measured with
#: a 600-line user).
FRAGMENT_FIELDS = [
    "content",
    "theme",
    "types",
    "created_at",
    "strengthen_count",
    "thread_id",
    "start_pos",
    "end_pos",
]


def build_line_schema() -> Any:
    """One row per line; BM25 over `terms` into `sparse`; `user_key` the partition key."""
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=LINE_PK_MAX_BYTES)
    schema.add_field(
        "user_key", DataType.VARCHAR, max_length=USER_KEY_MAX_BYTES, is_partition_key=True
    )
    schema.add_field("fragment_id", DataType.VARCHAR, max_length=PK_MAX_BYTES)
    schema.add_field("position", DataType.INT64)
    schema.add_field(
        "terms",
        DataType.VARCHAR,
        max_length=CONTENT_MAX_BYTES,
        enable_analyzer=True,
        analyzer_params=ANALYZER,
    )
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_field("fragment", DataType.VARCHAR, max_length=FRAGMENT_MAX_BYTES)
    schema.add_function(terms_bm25())
    return schema


def terms_bm25() -> Any:
    """The BM25 function that turns a line's `terms` into its `sparse` field."""
    return Function(
        name="terms_bm25",
        function_type=FunctionType.BM25,
        input_field_names=["terms"],
        output_field_names=["sparse"],
    )


def line_index_params() -> Any:
    """The sparse BM25 index and the scalar indexes reads filter on (without the one on
    `user_key`, Milvus Lite scans every user's rows: `activities/fragment_collection.py`)."""
    index = MilvusClient.prepare_index_params()
    index.add_index(
        "sparse",
        index_type="SPARSE_INVERTED_INDEX",
        metric_type="BM25",
        params=BM25_PARAMS,
    )
    index.add_index("user_key", index_type="INVERTED")
    index.add_index("fragment_id", index_type="INVERTED")
    return index


def fragment_json(fragment: Fragment) -> str:
    """The `fragment` column: FRAGMENT_FIELDS as JSON, within the column's limit (each field
    cut to its fragment-row limit first, then the content to what the others leave)."""
    fields = fragment_fields(fragment)
    fields = {name: fields[name] for name in FRAGMENT_FIELDS}
    content, fields["content"] = fields["content"], ""
    content = clip(content, FRAGMENT_MAX_BYTES - len(_dumps(fields).encode("utf-8")))
    while True:
        fields["content"] = content
        text = _dumps(fields)
        over = len(text.encode("utf-8")) - FRAGMENT_MAX_BYTES
        if over <= 0:
            return text
        # escapes made the JSON longer than the text: cut what is over, and try again
        content = clip(content, max(0, len(content.encode("utf-8")) - over))


def _dumps(fields: dict[str, Any]) -> str:
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


def line_rows(fragment: Fragment) -> list[dict[str, Any]]:
    """The rows of a fragment's lines (text trimmed to the column limits)."""
    key = checked_user(fragment.user_id)
    shared = fragment_json(fragment)
    rows = []
    for n, text in enumerate(line_texts(fragment.content)):
        rows.append(
            {
                "pk": line_id(fragment.id, n),
                "user_key": key,
                "fragment_id": fragment.id,
                "position": n,
                "terms": clip(indexed_terms(text), CONTENT_MAX_BYTES),
                "fragment": shared,
            }
        )
    return rows
