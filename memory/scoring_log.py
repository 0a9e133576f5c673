"""The scoring log: the bounded record of recent selections, which is how the formula is debugged.

Every selection keeps each candidate's cos, R, T, F and weighted terms. The log
travels in workflow state, so it must stay bounded: only the newest entries are kept.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from mnemoflow.models.fragments import ScoredCandidate, SelectionLog


def append_bounded(log: list[SelectionLog], entry: SelectionLog, limit: int) -> list[SelectionLog]:
    """A new list with `entry` appended, keeping only the newest `limit` entries."""
    if limit <= 0:
        return []
    return [*log, entry][-limit:]


class ScoringLog(BaseModel):
    """Recent selections, oldest first, bounded to `limit`; queryable by theme or fragment."""

    limit: int = Field(200, ge=1)
    entries: list[SelectionLog] = Field(default_factory=list)

    def append(self, entry: SelectionLog) -> ScoringLog:
        """A new log with the entry added (the oldest dropped past the limit)."""
        return ScoringLog(limit=self.limit, entries=append_bounded(self.entries, entry, self.limit))

    def recent(self, n: int, theme: str | None = None) -> list[SelectionLog]:
        """The newest n selections, newest first, optionally of one theme only."""
        chosen = [e for e in reversed(self.entries) if theme is None or e.theme == theme]
        return chosen[: max(0, n)]

    def lines_for(self, fragment_id: str) -> list[ScoredCandidate]:
        """Every logged line of one fragment, oldest first: why it was (not) picked over time."""
        return [c for e in self.entries for c in e.candidates if c.fragment_id == fragment_id]
