"""A user's stored history for the benchmarks that need one: LoCoMo turns, three lines to a
fragment, written as the worker writes them (`FragmentStore(lines=True)`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _locomo_data import conversations

LINES_PER_FRAGMENT = 3
#: Round numbers of history fragments start here, so that they never share an id with the
#: fragments a benchmark's own rounds write for the same user (`models.ids.fragment_id`).
HISTORY_ROUNDS = 1_000_000


def locomo_lines(data: Path) -> list[str]:
    """Every turn of the given LoCoMo conversations as a line of the user or the assistant."""
    return [
        f"{'User' if t.speaker == c.speaker_a else 'Assistant'}: {t.text}"
        for c in conversations(data)
        for t in c.turns
    ]


def history_fragments(
    user: str, lines: int, texts: list[str], now: float, *, first_round: int = 1
) -> list[Any]:
    """`lines` lines for `user` (past the given texts, repeated with a counter), oldest first,
    one second apart ending at `now`, 16 fragments a round, 40 fragments a thread."""
    from mnemoflow.models.fragments import Fragment
    from mnemoflow.models.ids import fragment_id

    out = []
    for n in range(0, lines, LINES_PER_FRAGMENT):
        body = []
        for k in range(n, min(n + LINES_PER_FRAGMENT, lines)):
            text = texts[k % len(texts)]
            body.append(text if k < len(texts) else f"{text} ({k // len(texts)})")
        f = n // LINES_PER_FRAGMENT
        round_no = first_round + f // 16
        out.append(
            Fragment(
                id=fragment_id(user, round_no, f % 16),
                user_id=user,
                theme="general",
                types=["chat"],
                content="\n".join(body),
                created_at=now - lines + n,
                reinforced_at=now - lines + n,
                round_no=round_no,
                thread_id=f"s{f // 40}",
                start_pos=n % (40 * LINES_PER_FRAGMENT),
                end_pos=n % (40 * LINES_PER_FRAGMENT) + len(body),
            )
        )
    return out
