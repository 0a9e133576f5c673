"""The demo's offline chat model: it can only answer from what the middleware gave it.

It reads nothing but its request: the system prompt (core prompt, then the injected profile and
fragments) and the messages left in the window. A question is answered with the sentence of that
material closest to it (multilingual sentence embeddings); anything else gets a short
acknowledgement. So a detail it repeats correctly reached it through memory or the window.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.embeddings import Embeddings
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field

from mnemoflow.memory.text import estimate_tokens, query_overlap

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
_BULLET = re.compile(r"^\s*(?:(?:[-*•]|\d+[.)])\s*)?(?:\[[^\]]*\]\s*)?(?:(?:User|Assistant):\s*)?")
_QUESTION = re.compile(r"\?\s*$|^(what|when|where|which|who|how|do|does|is|are|can)\b", re.I)
ACKS = ("Thanks, noted.", "Understood.", "Got it, thank you.", "Sure, I have that.")
MIN_SIMILARITY = 0.25
LEXICAL_WEIGHT = 0.5


def _sentences(text: str) -> list[str]:
    out = []
    for part in _SENTENCE.split(text):
        part = _BULLET.sub("", part).strip()
        if len(part) > 3 and not part.startswith("#"):
            out.append(part)
    return out


class RecallOnlyChatModel(BaseChatModel):
    """Deterministic offline chat model for the demo (answers only from its own request)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    embeddings: Embeddings
    core_prompt: str = ""
    clock: Callable[[], float] = Field(default=time.time)
    calls: int = 0
    last_system_prompt: str = ""

    @property
    def _llm_type(self) -> str:
        return "mnemoflow-demo-recall-only"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> RecallOnlyChatModel:  # type: ignore[override]
        """No tools in the demo; binding them changes nothing."""
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls += 1
        system = "\n".join(m.text for m in messages if isinstance(m, SystemMessage))
        self.last_system_prompt = system
        humans = [m for m in messages if isinstance(m, HumanMessage)]
        question = humans[-1].text if humans else ""
        if _QUESTION.search(question.strip()):
            reply = self._answer(question, system, humans[:-1])
        else:
            reply = ACKS[self.calls % len(ACKS)]
        # Estimated like every offline count (no provider to ask), so the ledger has numbers.
        tokens_in = sum(estimate_tokens(m.text) for m in messages)
        tokens_out = estimate_tokens(reply)
        message = AIMessage(
            content=reply,
            additional_kwargs={"time": self.clock()},
            usage_metadata={
                "input_tokens": tokens_in,
                "output_tokens": tokens_out,
                "total_tokens": tokens_in + tokens_out,
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _answer(self, question: str, system: str, earlier: list[HumanMessage]) -> str:
        material = system.replace(self.core_prompt, "") if self.core_prompt else system
        candidates = _sentences(material)
        for message in earlier:
            candidates += _sentences(message.text)
        # A question is never an answer, whoever asked it.
        candidates = [c for c in dict.fromkeys(candidates) if not _QUESTION.search(c)]
        if not candidates:
            return "I'm sorry, I don't know that."
        vectors = np.asarray(self.embeddings.embed_documents([question, *candidates]))
        lexical = np.asarray([query_overlap(question, c) for c in candidates])
        scores = vectors[1:] @ vectors[0] + LEXICAL_WEIGHT * lexical
        best = int(np.argmax(scores))
        if float(scores[best]) < MIN_SIMILARITY:
            return "I'm sorry, I don't know that."
        return f"From what I have: {candidates[best]}"
