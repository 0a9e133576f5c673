"""Our own small chat-turn model: LangChain message objects never cross into Temporal."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Role = Literal["human", "ai", "system", "tool"]


class ChatTurn(BaseModel):
    """One message of a thread, identified by its thread and position (so re-sends are no-ops)."""

    thread_id: str = Field(min_length=1, max_length=512)
    position: int = Field(ge=0, description="index of the message in the thread's state")
    role: Role
    content: str = ""
    time: float = Field(description="unix seconds, stamped when first seen")
    name: str | None = None
