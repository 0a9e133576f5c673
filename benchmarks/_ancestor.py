"""The ancestor, `memory-middleware` 0.3.0 from PyPI, mounted as its README asks.

- its state channels declared (messages / new_msg_idx / user_profile / system_prompt), so the
  positions it writes survive between turns (undeclared channels are dropped by LangGraph);
- `runtime.store` = an InMemoryStore, `runtime.context.user_id` from the agent's context;
- its three internal models (split, formula tuning, profile summary) replaced by offline fakes
  that wait `latency_s` per call, like mnemoflow's HeuristicMemoryModels(latency_s=...), and
  decide with the *same* heuristics (slice ranges and types, profile extraction), so recall
  differences come from the architecture, not from a smarter fake.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, NotRequired

# The ancestor loads the sqlite-vec extension; a CPython built without extension loading (pyenv's
# default) cannot, so use the pysqlite3 wheel's sqlite3 when it is installed (the bench extra).
try:
    import pysqlite3

    sys.modules["sqlite3"] = pysqlite3
except ImportError:  # pragma: no cover - a Python whose sqlite3 loads extensions
    pass

from langchain.agents.middleware.types import AgentState
from langchain_core.messages import BaseMessage, HumanMessage
from memory_middleware import BalancedMultiDimensionMemory, MemoryConfig
from memory_middleware.models import (
    SummaryMemoryAi,
    SummaryMemoryFragmentsConfig,
    TimeMemoryFormulaParam,
)
from memory_middleware.models import UserProfile as AncestorProfile
from memory_middleware.rag import FragmentsMemoryRAG
from memory_middleware.spliter import MemoryFragmentsAiSpliter
from memory_middleware.storage.vectors import SQLiteVecStore

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.activities.llm.heuristic_profile import extract_profile
from mnemoflow.models.turns import ChatTurn

ANCESTOR_TYPES = {"identity", "preference", "decision", "fact", "episode", "chat"}


class AncestorState(AgentState[Any]):
    """The state channels the ancestor reads and writes, declared."""

    new_msg_idx: NotRequired[int]
    user_profile: NotRequired[str]
    system_prompt: NotRequired[str]


class DeclaredAncestor(BalancedMultiDimensionMemory):
    """BalancedMultiDimensionMemory with its state fields declared (nothing else changed)."""

    state_schema = AncestorState


class _Counted:
    """Counts calls and estimated tokens (chars / 3.3), like the heuristic models' ledger."""

    def __init__(self, latency_s: float, ledger: dict[str, dict[str, int]], name: str) -> None:
        self.latency_s = latency_s
        self.ledger = ledger.setdefault(name, {"calls": 0, "input_tokens": 0, "output_tokens": 0})

    async def _account(self, messages: list[BaseMessage], answer: Any) -> None:
        self.ledger["calls"] += 1
        self.ledger["input_tokens"] += int(sum(len(str(m.content)) for m in messages) / 3.3)
        self.ledger["output_tokens"] += int(len(answer.model_dump_json()) / 3.3)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)


def _numbered_lines(text: str) -> list[tuple[str, str]]:
    """(role, content) of each `对应的消息索引i，role:content` line of the split prompt."""
    out = []
    for line in text.splitlines():
        if not line.startswith("对应的消息索引"):
            continue
        _, _, rest = line.partition("，")
        role, _, content = rest.partition(":")
        out.append((role, content))
    return out


class FakeSplitter(_Counted):
    """The split model: mnemoflow's heuristic slicer on the same messages, as SummaryMemoryAi."""

    def __init__(self, latency_s: float, ledger: dict[str, dict[str, int]]) -> None:
        super().__init__(latency_s, ledger, "split")
        self._heuristic = HeuristicMemoryModels()

    async def ainvoke(self, messages: list[BaseMessage], *_: Any, **__: Any) -> SummaryMemoryAi:
        lines = _numbered_lines(str(messages[-1].content))
        turns = [
            ChatTurn(
                thread_id="t",
                position=i,
                role="human" if role == "user" else "ai",
                content=content or ".",
                time=0.0,
            )
            for i, (role, content) in enumerate(lines)
        ]
        drafts = (await self._heuristic.slice(turns, 8)).drafts if turns else []
        config = [
            SummaryMemoryFragmentsConfig(
                theme=d["theme"],
                type=[t for t in d["types"] if t in ANCESTOR_TYPES] or ["chat"],
                start_idx=d["start_idx"],
                end_idx=d["end_idx"] + 1,  # the ancestor's ranges are half-open
            )
            for d in drafts
        ]
        answer = SummaryMemoryAi(
            theme_num=len(config), config=config, current_theme=config[-1].theme if config else ""
        )
        await self._account(messages, answer)
        return answer


class FakeTuner(_Counted):
    """The formula-tuning model: the documented defaults (no smarter than mnemoflow's)."""

    def __init__(self, latency_s: float, ledger: dict[str, dict[str, int]]) -> None:
        super().__init__(latency_s, ledger, "tune")

    async def ainvoke(self, messages: list[BaseMessage], *_: Any, **__: Any) -> Any:
        answer = TimeMemoryFormulaParam()
        await self._account(messages, answer)
        return answer


class FakeSummarizer(_Counted):
    """The profile model: mnemoflow's heuristic profile extraction, as the ancestor's profile."""

    def __init__(self, latency_s: float, ledger: dict[str, dict[str, int]]) -> None:
        super().__init__(latency_s, ledger, "summary")

    async def ainvoke(self, messages: list[BaseMessage], *_: Any, **__: Any) -> AncestorProfile:
        text = str(messages[-1].content)
        # The fragments carry raw message text; treat every line as the human's.
        update = extract_profile([f"User: {line}" for line in text.splitlines() if line.strip()])
        answer = AncestorProfile(
            user_name=update.name or "",
            user_occupation=update.occupation,
            user_hobby=list(update.hobbies),
            user_interest=list(update.interests),
            user_goals=list(update.goals),
            user_constraints=list(update.constraints),
        )
        await self._account(messages, answer)
        return answer


def ancestor_middleware(
    *,
    latency_s: float,
    embeddings: Any,
    db_path: str,
    core_prompt: str,
    trigger_messages: int = 12,
) -> tuple[DeclaredAncestor, dict[str, dict[str, int]]]:
    """The ancestor with offline fakes; returns it and its per-call-type ledger."""
    ledger: dict[str, dict[str, int]] = {}
    config = MemoryConfig.from_vocation(
        "customer service",
        pattern="messages",
        trigger_threshold=trigger_messages,
        rag_db_path=db_path,
        embeddings=embeddings,
        initial_prompt=core_prompt,
    )
    rag = FragmentsMemoryRAG(
        summary_llm=FakeSummarizer(latency_s, ledger),
        vector_store=SQLiteVecStore(db_path, embeddings, table=config.rag_table),
    )
    spliter = MemoryFragmentsAiSpliter(split_llm=FakeSplitter(latency_s, ledger))
    memory = DeclaredAncestor(
        config, summary_llm=FakeTuner(latency_s, ledger), spliter=spliter, rag=rag
    )
    return memory, ledger


def profile_text(profile: dict[str, Any]) -> str:
    """The stored profile as the app would put it in state['user_profile'] (non-empty fields)."""
    keep = {k: v for k, v in profile.items() if v not in (None, "", [], {}, "保密")}
    keep.pop("last_summarized_id", None)
    keep.pop("last_updated", None)
    return "\n".join(f"{k}: {v}" for k, v in keep.items())


__all__ = ["AncestorState", "HumanMessage", "ancestor_middleware", "profile_text"]
