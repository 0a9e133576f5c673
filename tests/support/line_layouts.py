"""Line collections as earlier versions of the store made them (activities/line_rows.py keeps
their names and fields: `EARLIER_LINES_SUFFIXES`, `EARLIER_LINE_FIELDS`), for the tests of the
migration and of the search that replaced them."""

from __future__ import annotations

from typing import Any

from pymilvus import DataType, MilvusClient

from mnemoflow.activities.line_rows import terms_bm25


def earlier_line_schema(dim: int, *, fragment: bool) -> Any:
    """`_lines` (`fragment=False`: the line's text, no fragment fields) or `_lines2`
    (`fragment=True`: its fragment's fields as JSON); both carried the fragment's vector on
    every line."""
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=200)
    schema.add_field("user_key", DataType.VARCHAR, max_length=64, is_partition_key=True)
    schema.add_field("fragment_id", DataType.VARCHAR, max_length=128)
    schema.add_field("position", DataType.INT64)
    if not fragment:
        schema.add_field("text", DataType.VARCHAR, max_length=4096)
    schema.add_field(
        "terms",
        DataType.VARCHAR,
        max_length=4096,
        enable_analyzer=True,
        analyzer_params={"tokenizer": "standard"},
    )
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    if fragment:
        schema.add_field("fragment", DataType.VARCHAR, max_length=65535)
    schema.add_function(terms_bm25())
    return schema
