"""A deterministic chat model for agent tests that count what was said against what is stored."""

from __future__ import annotations

import hashlib
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult


def receipt(text: str) -> str:
    """The chat model's answer to `text`: distinct per turn, and never containing the human's
    words, so each line can be counted on its own."""
    return f"Noted under receipt R-{hashlib.sha256(text.encode()).hexdigest()[:12]}."


class ReceiptModel(BaseChatModel):
    """Answers every turn with the receipt of the last human text (the same in every process)."""

    @property
    def _llm_type(self) -> str:
        return "receipt"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ReceiptModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        last = next(m for m in reversed(messages) if m.type == "human")
        reply = AIMessage(receipt(str(last.content)))
        return ChatResult(generations=[ChatGeneration(message=reply)])
