"""Past MAX_SEEN_MESSAGES remembered messages a user's oldest identities leave `seen`; a late
line older than the horizon is then refused only when the archive of identities that left
`seen` proves it was accepted (patch `seen-archive`, docs/ARCHITECTURE.md "Message identity").

Measured before: 4,505 lines said in one thread, then one late line a second client said among
the first ones; 4,504 stored, the late one refused with no error. These tests drive the
production state code (`state_ops.absorb_submit`, what the user workflow's loop runs) with
hand-overs in batches and a round after each, counting what was said against what was kept.
"""

from __future__ import annotations

import time
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
    InjectedContext,
    RoundRecord,
    RoundResult,
    SubmitEvent,
    UserMemoryInput,
    UserMemoryState,
)
from mnemoflow.models.turns import ChatTurn, turn_identity
from mnemoflow.models.usage import PriceTable
from mnemoflow.workflows import state_ops
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import eventually
from tests.support.invariants import identities_once
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger

CFG = MemoryConfig.from_vocation("customer service")
T0 = 1_796_000_000.0
SAID = 4_505  # the measured case: more than MAX_SEEN_MESSAGES
BATCH = 100


class Rule:
    """The workflow's patch answer, counted (the workflow asks it once per run)."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return True


def line(writer: str, n: int, t: float, thread: str = "shared") -> ChatTurn:
    return ChatTurn(
        thread_id=thread,
        position=n,
        role="human" if n % 2 == 0 else "ai",
        content=f"{writer} says line {n}: parcel {writer}-{n} weighs {n % 97 + 1} kg",
        time=t,
        message_id=f"{writer}-{n}",
    )


class Stored:
    """What the user workflow kept: every turn a round took (in order), by identity."""

    def __init__(self) -> None:
        self.turns: list[ChatTurn] = []
        self.rounds = 0

    def index(self, s: UserMemoryState, thread: str, now: float) -> None:
        batch = list(s.threads[thread].pending)
        if not batch:
            return
        self.rounds += 1
        record = RoundRecord(
            round_no=self.rounds, workflow_id="w", event_id=f"r{self.rounds}",
            thread_id=thread, start=0, end=len(batch), trigger="handover",
        )  # fmt: skip
        result = RoundResult(
            round_no=self.rounds, fragments=[], context=InjectedContext(user_id="u", version=1)
        )
        state_ops.round_completed(s, record, result, batch, now, PriceTable())
        self.turns.extend(batch)


def submit(s: UserMemoryState, event: str, turns: list[ChatTurn], now: float, rule: Rule) -> None:
    state_ops.absorb_submit(
        s, SubmitEvent(event_id=event, turns=turns), CFG, now, True, archive_rule=rule
    )


def said_by_first(s: UserMemoryState, stored: Stored, rule: Rule) -> list[ChatTurn]:
    """SAID lines of the first client, one a second apart, handed over in batches, each
    batch stored by a round before the next arrives."""
    said = [line("first", n, T0 + n) for n in range(SAID)]
    for at in range(0, SAID, BATCH):
        now = T0 + at + BATCH
        submit(s, f"first-{at}", said[at : at + BATCH], now, rule)
        stored.index(s, "shared", now)
    return said


def test_a_late_line_older_than_the_horizon_is_stored_past_4096_messages(
    reliability: Ledger, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    s, stored, rule = UserMemoryState(), Stored(), Rule()
    said = said_by_first(s, stored, rule)
    ts = s.threads["shared"]
    assert len(ts.seen) <= state_ops.MAX_SEEN_MESSAGES
    assert ts.horizon > T0 + 10.5, "the first lines left `seen`: the case under test"

    # A second client's line said between lines 10 and 11, delivered only now.
    late = line("second", 0, T0 + 10.5)
    now = T0 + SAID + 60
    submit(s, "second-0", [late], now, rule)
    stored.index(s, "shared", now)
    # The first client's process died and its app re-sends the whole thread (resync).
    for at in range(0, SAID, 500):
        submit(s, f"resend-{at}", said[at : at + 500], now + 1, rule)
    stored.index(s, "shared", now + 1)

    kept = [turn_identity(t) for t in stored.turns]
    should = [turn_identity(t) for t in [*said, late]]
    outcome = identities_once(should, kept)
    assert turn_identity(late) in kept, "the late line was refused"
    assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
    assert len(kept) == SAID + 1
    assert ts.accepted == ts.indexed == SAID + 1
    assert rule.asked >= 1  # the workflow's patch decided it
    # Bounded: the archive holds what left `seen`, ARCHIVE_KEY_BYTES each.
    assert len(s.seen_archive) <= 4 * (
        state_ops.MAX_ARCHIVED_MESSAGES * state_ops.ARCHIVE_KEY_BYTES // 3 + 1
    )
    reliability.record(
        request,
        key="late-line-past-seen-bound",
        kind="fault",
        what=f"{SAID:,} lines said in one thread (batches of {BATCH}, each stored by a round), "
        "then one late line a second client said among the first ten, then the whole thread "
        "re-sent",
        happened=f"{len(kept):,} of {len(should):,} distinct lines stored, the late one "
        "included; each re-sent line known from `seen` or the archive of identities that left "
        f"it ({len(s.seen_archive) * 3 // 4:,} bytes)",
        outcome=outcome,
        started=started,
    )


def test_a_late_line_to_a_pruned_idle_thread_is_stored() -> None:
    s, stored, rule = UserMemoryState(), Stored(), Rule()
    old = [line("first", n, T0 + n, thread="old") for n in range(4)]
    submit(s, "old", old, T0 + 10, rule)
    stored.index(s, "old", T0 + 10)
    now = T0 + 10
    for i in range(state_ops.MAX_IDLE_THREADS):  # the thread goes idle and is pruned
        now = T0 + 20 + i
        submit(s, f"o{i}", [line("other", i, now - 5, thread=f"o{i}")], now, rule)
        stored.index(s, f"o{i}", now)
    assert "old" not in s.threads
    late = line("second", 1, T0 + 1.5, thread="old")  # said among the old lines, delivered now
    submit(s, "late", [late, *old], now + 1, rule)
    stored.index(s, "old", now + 1)
    kept = [turn_identity(t) for t in stored.turns if t.thread_id == "old"]
    assert kept.count(turn_identity(late)) == 1, kept
    assert len(kept) == len(set(kept)) == 5  # the re-sent old lines are not stored again


def test_without_the_patch_the_horizon_rule_replays() -> None:
    """Histories recorded before the archive replay the old rule (no patch marker)."""
    s, stored = UserMemoryState(), Stored()

    class Old(Rule):
        def __call__(self) -> bool:
            self.asked += 1
            return False

    rule = Old()
    said_by_first(s, stored, rule)
    submit(s, "second-0", [line("second", 0, T0 + 10.5)], T0 + SAID + 60, rule)
    assert not s.threads["shared"].pending
    assert rule.asked == 1


@pytest.mark.integration
async def test_the_user_workflow_stores_the_late_line_past_4096_messages(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """The production wiring: a user workflow run carrying the state of 4,505 stored lines
    (continue-as-new input, as a long-lived user's run has it) takes the second client's late
    line through its loop, the patch asked there, and a re-send of the first lines not again."""
    s, stored = UserMemoryState(), Stored()
    said = said_by_first(s, stored, Rule())
    assert s.threads["shared"].horizon > T0 + 10.5 and s.seen_archive
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        async with mw.memory_client(redis_url) as client:
            user = f"archive-{uuid.uuid4().hex[:8]}"
            mw.track(client.workflow_id(user))
            await dev_env.client.start_workflow(
                UserMemoryWorkflow.run,
                UserMemoryInput(user_id=user, config=client.config, state=s),
                id=client.workflow_id(user),
                task_queue=mw.task_queue,
            )
            late = line("second", 0, T0 + 10.5)
            await client.submit(user, [late, *said[:50]])

            async def took() -> bool:
                status = await client.status(user)
                return (
                    status is not None
                    and status.pending_events == 0
                    and bool(status.watermarks.get("shared"))
                    and status.watermarks["shared"].accepted > SAID
                )

            await eventually(took, deadline_s=60, what="the late line absorbed")
            status = await client.status(user)
    assert status is not None
    mark = status.watermarks["shared"]
    assert mark.accepted == SAID + 1  # the late line, and none of the re-sent ones
    # its round may already have run (the line was said long ago: mature)
    assert (mark.indexed, status.pending_turns) in ((SAID, 1), (SAID + 1, 0))
