"""LoCoMo conversations as the benchmark reads them, the evidence checks, and the raw-turn
baselines (BM25, dense, recency) packed to a token budget. See benchmarks/locomo.py."""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_DATE = re.compile(r"(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+(\w+),?\s+(\d{4})", re.I)
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_name) if m}
#: Seconds between the turns of a session (LoCoMo dates sessions, not turns).
TURN_GAP_S = 30.0


def parse_date(text: str) -> float:
    """'1:56 pm on 8 May, 2023' -> unix seconds (UTC)."""
    m = _DATE.search(text)
    if m is None:
        raise ValueError(f"unreadable LoCoMo date: {text!r}")
    hour, minute, ampm, day, month, year = m.groups()
    h = int(hour) % 12 + (12 if ampm.lower() == "pm" else 0)
    return float(
        calendar.timegm((int(year), _MONTHS[month.lower()], int(day), h, int(minute), 0, 0, 0, 0))
    )


@dataclass
class Turn:
    dia_id: str
    speaker: str
    text: str
    time: float
    session: int


@dataclass
class Conversation:
    name: str
    speaker_a: str
    speaker_b: str
    sessions: dict[int, list[Turn]] = field(default_factory=dict)
    questions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def turns(self) -> list[Turn]:
        return [t for n in sorted(self.sessions) for t in self.sessions[n]]


def load(path: Path) -> Conversation:
    """One conversation file; questions of categories 1-4 only (5 is adversarial)."""
    found = conversations(path)
    if len(found) != 1:
        raise ValueError(f"{path} holds {len(found)} conversations, not one")
    return found[0]


def conversations(path: Path, limit: int = 0) -> list[Conversation]:
    """The conversations at `path`: a folder of JSON files, or one file. A file holds one
    conversation (as in ../shared/data/locomo) or a list of them (the published
    `locomo10.json`, each named by its `sample_id`). `limit`: the first N (0: all)."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    out: list[Conversation] = []
    for file in files:
        raw = json.loads(file.read_text())
        items = raw if isinstance(raw, list) else [raw]
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ValueError(f"{file}: item {i} is not a LoCoMo conversation object")
            alone = file.stem if len(items) == 1 else f"{file.stem}-{i}"
            name = str(item.get("sample_id") or alone)
            out.append(_conversation(name, item, file))
    return out[:limit] if limit else out


def _conversation(name: str, raw: dict[str, Any], file: Path) -> Conversation:
    data = raw.get("conversation", raw)
    try:
        conv = Conversation(name, data["speaker_a"], data["speaker_b"])
    except KeyError as err:
        raise ValueError(f"{file}: conversation {name} has no {err.args[0]}") from None
    for key in data:
        m = re.fullmatch(r"session_(\d+)", key)
        if not m or not data[key]:
            continue
        n = int(m.group(1))
        when = data.get(f"session_{n}_date_time")
        if not when:
            raise ValueError(f"{file}: conversation {name}, session {n} has no date_time")
        start = parse_date(when)
        conv.sessions[n] = [
            Turn(t["dia_id"], t["speaker"], t.get("text", ""), start + i * TURN_GAP_S, n)
            for i, t in enumerate(data[key])
        ]
    conv.questions = [q for q in raw.get("qa", []) if q.get("category") in CATEGORIES]
    return conv


def session_turns(conv: Conversation, session: int) -> list[Any]:
    """A session's non-empty turns as the ChatTurns an integrator hands over (thread
    `session-<n>`, speaker A as the human), in order."""
    from mnemoflow.models.turns import ChatTurn

    return [
        ChatTurn(
            thread_id=f"session-{session}",
            position=i,
            role="human" if t.speaker == conv.speaker_a else "ai",
            content=t.text,
            time=t.time,
            name=t.speaker,
        )
        for i, t in enumerate(conv.sessions[session])
        if t.text.strip()
    ]


def norm(text: str) -> str:
    """Case and whitespace normalised, as the evidence check compares."""
    return " ".join(text.casefold().split())


def evidence_texts(conv: Conversation, question: dict[str, Any]) -> list[str]:
    """The normalised texts of a question's evidence turns (ids not in the data are skipped)."""
    by_id = {t.dia_id: t for t in conv.turns}
    out = []
    for ref in question.get("evidence", []):
        for part in re.split(r"[;,\s]+", str(ref)):
            if part in by_id and by_id[part].text.strip():
                out.append(norm(by_id[part].text))
    return out


def judge(injected: str, evidence: Sequence[str], answer: Any) -> dict[str, bool]:
    """all/any evidence turns present, and the answer contained, in the injected text."""
    text = norm(injected)
    hits = [e in text for e in evidence]
    return {
        "all": bool(hits) and all(hits),
        "any": any(hits),
        "answer": bool(str(answer).strip()) and norm(str(answer)) in text,
    }


def turn_line(turn: Turn, date: Callable[[float], str]) -> str:
    return f"[{date(turn.time)}] {turn.speaker}: {turn.text}"


def pack_turns(order: Sequence[int], lines: Sequence[str], budget: int, count: Any) -> str:
    """The lines in `order` that fit `budget` tokens (skipping ones that do not), as one text."""
    used, kept = 0, []
    for i in order:
        cost = count(lines[i]) + 1
        if used + cost <= budget:
            kept.append(lines[i])
            used += cost
    return "\n".join(kept)


class Baselines:
    """Retrieval over the raw turns of one conversation: BM25, dense (same USE model), recency."""

    def __init__(self, conv: Conversation, embeddings: Any, count: Any, date: Any) -> None:
        import numpy as np

        from mnemoflow.memory.search import BM25
        from mnemoflow.memory.text import normalise, token_list

        self._tokens = lambda text: token_list(normalise(text))
        self.turns = [t for t in conv.turns if t.text.strip()]
        self.lines = [turn_line(t, date) for t in self.turns]
        self.count = count
        self.bm25 = BM25([self._tokens(t.text) for t in self.turns])
        vectors = np.asarray(embeddings.embed_documents([t.text for t in self.turns]))
        self.vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        self.embeddings = embeddings
        self.full_context_tokens = sum(count(line) + 1 for line in self.lines)

    def bm25_text(self, question: str, budget: int) -> str:
        scores = self.bm25.scores(self._tokens(question))
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return pack_turns([i for i in order if scores[i] > 0], self.lines, budget, self.count)

    def dense_text(self, question: str, budget: int) -> str:
        import numpy as np

        q = np.asarray(self.embeddings.embed_query(question))
        cos = self.vectors @ (q / np.linalg.norm(q))
        order = sorted(range(len(cos)), key=lambda i: (-float(cos[i]), i))
        return pack_turns(order, self.lines, budget, self.count)

    def hybrid_text(self, question: str, budget: int) -> str:
        """Dense + BM25 over the raw turns, fused by reciprocal rank (k = 60, equal weights),
        BM25 over each turn as packed, its session date and speaker included (`turn_line`):
        the hybrid baseline of issue 30."""
        import numpy as np

        from mnemoflow.memory.search import rrf

        if not hasattr(self, "_dated"):
            from mnemoflow.memory.search import BM25

            self._dated = BM25([self._tokens(line) for line in self.lines])
        scores = self._dated.scores(self._tokens(question))
        lexical = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
        q = np.asarray(self.embeddings.embed_query(question))
        cos = self.vectors @ (q / np.linalg.norm(q))
        dense = sorted(range(len(cos)), key=lambda i: (-float(cos[i]), i))
        fused = rrf([lexical, dense])
        order = sorted(fused, key=lambda i: (-fused[i], i))
        return pack_turns(order, self.lines, budget, self.count)

    def recency_text(self, budget: int) -> str:
        order = list(range(len(self.lines) - 1, -1, -1))
        return pack_turns(order, self.lines, budget, self.count)
