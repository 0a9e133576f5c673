"""What "nothing lost, nothing duplicated" means, checked the same way by every fault test.

Every checker returns an `Outcome`: how many messages it counted (`said`), how many of them are
lost and how many copies are stored beyond those expected. The test asserts on it and passes it
whole to the reliability ledger (`reliability.record(..., outcome=...)`), so docs/RELIABILITY.md
shows what was counted, never a number written after the asserts.

`said_vs_stored` counts what was said against what is stored, line by line (every turn with
distinct content), and lines forgotten against none stored. `refused_or_stored` counts input
that must be refused with a clear error or else stored once. `leaked_to` counts another user's
words under a user. `indexed_once` checks the rounds' ordinals of each thread:
- every expected message position of a thread is in exactly one completed round, and the
  thread's watermarks reached the end (lost: positions in no completed round, or past the
  indexed watermark; duplicated: positions in more than one);
- the user's fragments in Milvus are exactly those of the completed rounds (count per round as
  the round recorded; a row of a failed or unknown round is a duplicate of the retried one);
- fragment primary keys are unique;
- the induction cursor and indexed watermarks never move backwards (`Monotonic`, fed with every
  status a test observes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.models.contracts import UserStatus


@dataclass
class Outcome:
    """Counts for the reliability ledger: of the `said` messages (or lines) counted, `lost`
    ones are neither stored nor refused with a clear error, and `duplicated` counts copies
    stored beyond the one expected (a forgotten line, or another user's, expects none); the
    user's `fragments` and completed `rounds` as found. Outcomes of several users or phases
    add up with `+`. `said == 0`: no message was in play (the ledger shows n/a)."""

    lost: int
    duplicated: int
    fragments: int
    rounds: int
    said: int = 0

    def __add__(self, other: Outcome) -> Outcome:
        return Outcome(
            self.lost + other.lost,
            self.duplicated + other.duplicated,
            self.fragments + other.fragments,
            self.rounds + other.rounds,
            self.said + other.said,
        )

    @property
    def clean(self) -> bool:
        """Nothing lost, nothing duplicated."""
        return self.lost == 0 and self.duplicated == 0


def no_messages() -> Outcome:
    """The outcome of a fault that involves no message at all (a codec server flooded before
    any payload): nothing to count, shown as n/a in the ledger."""
    return Outcome(lost=0, duplicated=0, fragments=0, rounds=0, said=0)


def refused_or_stored(
    said: Sequence[str], refused: Sequence[str], stored: Sequence[str]
) -> Outcome:
    """Bad input at the door: each message `said` must be refused with a clear error (`refused`:
    those whose call raised it, as the test saw) or else be in `stored` (the texts of what
    memory holds) exactly once. Lost: neither; duplicated: stored though refused, or twice."""
    lost = duplicated = 0
    for text in said:
        hits = sum(row.count(text) for row in stored) if text else 0
        if text in refused:
            duplicated += hits
        else:
            lost += hits == 0
            duplicated += max(0, hits - 1)
    return Outcome(lost, duplicated, fragments=len(stored), rounds=0, said=len(said))


def identities_once(said: Sequence[str], stored: Sequence[str]) -> Outcome:
    """State-level runs with no store: `said` are the identities of the messages said (each
    once), `stored` the identities the rounds took. Lost: said and never stored; duplicated:
    stored more than once, or stored and never said."""
    counts = Counter(stored)
    lost = sum(1 for key in set(said) if counts[key] == 0)
    duplicated = sum(n - 1 for n in counts.values() if n > 1)
    duplicated += sum(n for key, n in counts.items() if key not in set(said))
    return Outcome(lost, duplicated, fragments=0, rounds=0, said=len(said))


def secrets_in(text: str, secrets: Sequence[str]) -> Outcome:
    """Words that must never be written out (log lines, printouts): every copy of one of
    `secrets` found in `text` counts as duplicated (a copy where none is expected)."""
    duplicated = sum(text.count(secret) for secret in secrets if secret)
    return Outcome(0, duplicated, fragments=0, rounds=0, said=len(secrets))


async def still_readable(codec: Any, payloads: Sequence[Any]) -> Outcome:
    """Payloads sealed under a forgotten user's key, decoded one by one with `codec` (another
    process's, say): each that still decrypts is a copy that outlived the forget (duplicated);
    the only refusal counted as such is KeyDestroyedError."""
    from mnemoflow.worker.data_keys import KeyDestroyedError

    readable = 0
    for payload in payloads:
        try:
            await codec.decode([payload])
            readable += 1
        except KeyDestroyedError:
            pass
    return Outcome(0, readable, fragments=0, rounds=0, said=len(payloads))


async def words_stored(store: FragmentStore, user: str, words: Sequence[str]) -> Outcome:
    """Distinct `words` said (one per line) against the user's rows: lost when in none,
    duplicated for every row beyond the first that holds one."""
    fragments = await store.all_for_user(user)
    lost = duplicated = 0
    for w in words:
        holding = sum(1 for f in fragments if w in f.content)
        lost += holding == 0
        duplicated += max(holding - 1, 0)
    return Outcome(lost, duplicated, fragments=len(fragments), rounds=0, said=len(words))


async def leaked_to(store: FragmentStore, user: str, lines: Sequence[str] | None = None) -> Outcome:
    """Another user's words under `user`: each of `lines` found in their rows counts as a
    duplicate (a copy where none is expected); with `lines` None, `user` said nothing, and
    every row they have is one."""
    fragments = await store.all_for_user(user)
    if lines is None:
        leaked = len(fragments)
    else:
        leaked = sum(f.content.count(line) for f in fragments for line in lines)
    return Outcome(lost=0, duplicated=leaked, fragments=len(fragments), rounds=0, said=0)


async def indexed_once(
    store: FragmentStore, user: str, status: UserStatus, expected: dict[str, int]
) -> Outcome:
    """Lost and duplicated counts of a user's memory against the expected thread lengths."""
    fragments = await store.all_for_user(user)
    completed = [r for r in status.rounds if r.status == "completed"]
    completed_nos = {r.round_no for r in completed}
    ids = [f.id for f in fragments]
    duplicated = len(ids) - len(set(ids))
    duplicated += sum(1 for f in fragments if not f.explicit and f.round_no not in completed_nos)
    lost = 0
    per_round = Counter(f.round_no for f in fragments if not f.explicit)
    for record in completed:
        stored = per_round[record.round_no]
        lost += max(0, record.fragments - stored)
        duplicated += max(0, stored - record.fragments)
    for thread, end in expected.items():
        covered = Counter(
            p for r in completed if r.thread_id == thread for p in range(r.start, r.end)
        )
        lost += sum(1 for p in range(end) if covered[p] == 0)
        duplicated += sum(n - 1 for n in covered.values() if n > 1)
        mark = status.watermarks.get(thread)
        if mark is None or mark.indexed < end or mark.accepted < end:
            lost += 1
    return Outcome(lost, duplicated, len(fragments), len(completed), sum(expected.values()))


@dataclass
class Monotonic:
    """Feed it every status observed: the cursor and indexed watermarks never go back."""

    cursor: int = 0
    indexed: dict[str, int] = field(default_factory=dict)
    seen: int = 0

    def see(self, status: UserStatus) -> bool:
        """Check one status against the ones before (True, so it fits in a predicate)."""
        assert status.induction_cursor >= self.cursor, "induction cursor moved backwards"
        self.cursor = status.induction_cursor
        for thread, mark in status.watermarks.items():
            before = self.indexed.get(thread, 0)
            assert mark.indexed >= before, f"indexed watermark of {thread} moved backwards"
            self.indexed[thread] = mark.indexed
        self.seen += 1
        return True


async def said_vs_stored(
    store: FragmentStore,
    user: str,
    status: UserStatus | None,
    said: dict[str, list[str]],
    *,
    forgotten: Sequence[str] = (),
) -> Outcome:
    """Lost and duplicated counts of what was said (distinct lines per thread) against what the
    user's fragments hold: each line verbatim in exactly one fragment, and each thread's
    watermarks counting every line as accepted and indexed (not checked with `status` None).
    Each line of `forgotten` (said, then forgotten) must be in none: every copy left counts as
    duplicated. Positions play no part: other middleware, other writers and re-sends reorder
    and rewrite lists (docs/ARCHITECTURE.md, "Message identity")."""
    lines = [line for thread_lines in said.values() for line in thread_lines]
    assert len(set(lines)) == len(lines), "give every turn distinct content"
    assert not set(lines) & set(forgotten), "a line is either kept or forgotten"
    fragments = await store.all_for_user(user)
    texts = [f.content for f in fragments]
    lost = duplicated = 0
    for line in lines:
        hits = sum(text.count(line) for text in texts)
        lost += hits == 0
        duplicated += max(0, hits - 1)
    for line in forgotten:
        duplicated += sum(text.count(line) for text in texts)
    if status is not None:
        for thread, thread_lines in said.items():
            mark = status.watermarks.get(thread)
            if mark is None or mark.indexed != mark.accepted or mark.accepted < len(thread_lines):
                lost += 1
    ids = [f.id for f in fragments]
    duplicated += len(ids) - len(set(ids))
    completed = sum(1 for r in status.rounds if r.status == "completed") if status else 0
    return Outcome(lost, duplicated, len(fragments), completed, len(lines) + len(forgotten))
