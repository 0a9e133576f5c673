"""What "a user's memory has caught up" means, for `MemoryClient.settle`.

Settled: every message the user workflow accepted is indexed, no event waits in its inboxes,
no round runs, and the read model in Redis holds the workflow's latest context version (so the
next model call injects it). With `inducted`, also every fragment folded into the profile,
which happens only once fragments reach the long-term gate. Kept apart from the client so the
rule is one pure function that names what is still pending.
"""

from __future__ import annotations

from dataclasses import dataclass

from mnemoflow.models.contracts import UserStatus

#: How often settle asks again: a status query is cheap, and memory work takes seconds.
SETTLE_POLL_S = 0.2


@dataclass(frozen=True)
class Published:
    """Context versions: the workflow's latest, and what Redis holds (None: nothing there;
    `unreadable` is why Redis could not be read). `checked` False: no read model to check."""

    latest: int
    in_redis: int | None = None
    unreadable: str | None = None
    checked: bool = True


class MemoryNotSettledError(TimeoutError):
    """`MemoryClient.settle` ran out of time; `pending` names what was still outstanding."""

    def __init__(self, user_id: str, timeout_s: float, pending: list[str]) -> None:
        self.user_id = user_id
        self.timeout_s = timeout_s
        self.pending = pending
        super().__init__(
            f"memory of user {user_id[:80]!r} did not settle within {timeout_s:g} s; still "
            f"pending: {'; '.join(pending)}. Messages wait for maturity until their round is "
            "due: MemoryClient.consolidate(user, thread) makes a thread's round due now"
        )


def pending_work(status: UserStatus, published: Published, *, inducted: bool) -> list[str]:
    """What keeps the user's memory from being settled, in words; empty when it is settled."""
    pending: list[str] = []
    if status.forget_pending:
        pending.append("a forget is under way")
    if status.undelivered:
        pending.append(f"{status.undelivered} messages not yet delivered by this client")
    behind = {t: m for t, m in status.watermarks.items() if m.indexed < m.accepted}
    for thread, mark in behind.items():
        pending.append(
            f"thread {thread[:60]!r} has {mark.accepted - mark.indexed} accepted messages not "
            f"indexed (indexed {mark.indexed} of {mark.accepted})"
        )
    if status.pending_turns and not behind:
        pending.append(f"{status.pending_turns} turns wait for a round")
    if status.pending_events:
        pending.append(f"{status.pending_events} events not yet absorbed by the workflow")
    running = [r.round_no for r in status.rounds if r.status == "running"]
    if running:
        pending.append(f"round {', '.join(map(str, running))} running")
    if published.checked:
        if published.unreadable is not None:
            pending.append(f"read model not readable ({published.unreadable})")
        elif (published.in_redis or 0) < published.latest:
            held = "nothing" if published.in_redis is None else f"v{published.in_redis}"
            pending.append(
                f"read model holds {held}, the workflow's latest context is v{published.latest}"
            )
    if inducted and status.uninducted:
        pending.append(f"{status.uninducted} fragments not yet inducted into the profile")
    if pending and status.last_error:
        pending.append(f"last error: {status.last_error}")
    return pending
