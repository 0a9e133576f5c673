"""What a Temporal history holds, as text: every payload's data decoded (a history's JSON holds
payload data in base64, so searching it for a sentence finds nothing either way)."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory


def payloads_text(history: WorkflowHistory) -> str:
    """Every payload anywhere in the history's events, decoded as UTF-8, one per line."""
    out: list[str] = []

    def walk(message: Any) -> None:
        if isinstance(message, Payload):
            out.append(message.data.decode("utf-8", "replace"))
            return
        for field, value in message.ListFields():
            if field.message_type is None:
                continue
            if not field.is_repeated:
                walk(value)
                continue
            items = value.values() if field.message_type.GetOptions().map_entry else value
            for item in items:
                if hasattr(item, "ListFields"):
                    walk(item)

    for event in history.events:
        walk(event)
    return "\n".join(out)


def user_key_payloads(events: list[HistoryEvent]) -> list[Payload]:
    """Every payload of these events sealed with a user's data key."""
    found: list[Payload] = []

    def walk(message: object) -> None:
        if isinstance(message, Payload):
            if message.metadata.get("encryption-key-id", b"").startswith(b"dek:"):
                found.append(message)
            return
        for field, value in message.ListFields():  # type: ignore[attr-defined]
            if field.message_type is None:
                continue
            if isinstance(value, Message):
                walk(value)
            else:  # a repeated field, or a map (header fields, memo)
                for item in value.values() if hasattr(value, "values") else value:
                    walk(item)

    for event in events:
        walk(event)
    return found
