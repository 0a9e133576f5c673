"""Registering mnemoflow's custom search attributes on a Temporal server.

The dev server gets them as `--search-attribute` flags at start (`wanted()`, passed by
`mnemoflow.devstack.temporal_dev`); the time-skipping test server and existing clusters get
them through the operator service (`ensure_search_attributes`, idempotent). The keys
themselves live in the pure module `mnemoflow.models.search_attributes`, which workflows import.
"""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType
from temporalio.service import RPCError, RPCStatusCode

from mnemoflow.models.search_attributes import ALL_KEYS

# The CLI spells types by name ("Keyword", "Int"); the SDK enum's names are upper case.
_CLI_TYPE_NAMES = {
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.BOOL: "Bool",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
}


def wanted() -> dict[str, str]:
    """The custom attributes as name -> CLI type name."""
    return {key.name: _CLI_TYPE_NAMES[key.indexed_value_type] for key in ALL_KEYS}


async def registered(client: Client) -> dict[str, str]:
    """Custom search attributes the client's namespace knows, as name -> CLI type name."""
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    return {
        name: _CLI_TYPE_NAMES[SearchAttributeIndexedValueType(int(value))]
        for name, value in response.custom_attributes.items()
        if int(value) in {member.value for member in _CLI_TYPE_NAMES}
    }


async def ensure_search_attributes(client: Client) -> None:
    """Register every missing mnemoflow search attribute (a no-op when all exist)."""
    try:
        present = await registered(client)
    except RPCError as err:
        # The time-skipping test server cannot list them; adding is still supported there.
        if err.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        present = {}
    missing = {
        key.name: IndexedValueType.ValueType(int(key.indexed_value_type))
        for key in ALL_KEYS
        if key.name not in present
    }
    if not missing:
        return
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    except RPCError as err:
        # Another worker may have registered them between our list and our add.
        if err.status != RPCStatusCode.ALREADY_EXISTS:
            raise
