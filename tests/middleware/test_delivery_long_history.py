"""Past the repeat filter's round window (docs/ARCHITECTURE.md, "The round": the index step
compares a round's fragments with the last REPEAT_ROUNDS rounds' and the nearest stored ones,
not with the whole history), nothing said is dropped and a true repeat is still caught.

Production wiring end to end: two agent processes' writers (their own MemoryClients and
checkpointers, one with LangChain's SummarizationMiddleware, one with a trimming middleware)
hand over to one user's workflow on the dev server, served by two worker processes, one round
per turn for more rounds than the window holds. Early facts are updated near the end (the same
sentence, one number changed): every line said is counted against what is stored. Then an
exchange of round 5, told again word for word in a new thread 36 rounds later, is not stored
twice.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from mnemoflow.activities.fragments import REPEAT_ROUNDS
from tests.middleware.test_delivery import HOUR, Writer, keep_last_six, settled, summarizer
from tests.support.invariants import said_vs_stored
from tests.support.process_stack import process_stack
from tests.support.reliability import Ledger
from tests.support.worker_process import worker_process

pytestmark = pytest.mark.integration

ROUNDS = REPEAT_ROUNDS + 8
THINGS = ["gym locker", "bike lock", "storage unit", "garage door", "office safe", "mailbox"]


def fact(k: int, code: int) -> str:
    return f"Note {k}: the code of my {THINGS[k % len(THINGS)]} is {code}."


async def test_past_the_repeat_window_updates_are_kept_and_a_repeat_is_not(
    milvus_uri: str,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    rng = random.Random(20261206)
    async with process_stack(tmp_path, milvus_uri, redis_url, "long", clients=2) as stack:
        temporal, store, clients = stack.temporal, stack.store, stack.clients
        user, common = f"long-{stack.tag}", stack.worker_args
        t0 = time.time() - 3 * HOUR
        writers = [
            Writer(clients[0], [summarizer()], True, t0),
            Writer(clients[1], [keep_last_six], False, t0 + 1),
        ]
        threads = ["a", "b"]
        codes = [rng.randint(1000, 8999) for _ in range(4)]
        said: dict[str, list[str]] = {"a": [], "b": [], "c": []}
        first: list[str] = []
        with (
            worker_process(tmp_path, "one", **common),  # type: ignore[arg-type]
            worker_process(tmp_path, "two", **common),  # type: ignore[arg-type]
        ):
            for r in range(ROUNDS):
                w = r % 2
                if r < len(codes):  # told in the first rounds ...
                    text = fact(r, codes[r])
                elif r >= ROUNDS - len(codes):  # ... and updated past the window
                    k = r - (ROUNDS - len(codes))
                    text = fact(k, codes[k] + 1)
                else:
                    # Unrelated to every other line (a third of its words in common with a
                    # later line would make that line an update of it: `changes`).
                    words = [f"{w}{rng.getrandbits(24):06x}" for w in ("seed", "cart", "dock")]
                    text = f"Noticed {' '.join(words)}."
                said[threads[w]] += [text, await writers[w].say(user, threads[w], text)]
                if r == len(codes):  # a fact never updated, told again at the end
                    first = said[threads[w]][-2:]
                await writers[w].memory.flush(timeout_s=60)  # handed over (the workflow exists)
                await clients[w].consolidate(user, threads[w])  # one round for this turn
                status = await clients[w].settle(user, 120)
                assert status is not None and status.rounds_failed == 0, status
            # Round 5's exchange told again, word for word, in a new thread (a told fact that a
            # later one changed would be news again: docs/ARCHITECTURE.md, "The round").
            again = [first[0], await writers[0].say(user, "c", first[0])]
            assert again[1] == first[1]
            for writer in writers:
                await writer.memory.flush(timeout_s=60)
            status = await settled(clients[0], user, ["a", "b", "c"])
            assert status.rounds_failed == 0, status.last_error
            stored = [f.content for f in await store.all_for_user(user)]
            # The repeat was accepted and indexed (the watermarks count it) but not stored twice.
            assert sum(text.count(first[0]) for text in stored) == 1
            assert status.watermarks["c"].indexed == status.watermarks["c"].accepted == 2
            outcome = await said_vs_stored(
                store, user, status, {k: v for k, v in said.items() if v}
            )
            assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
            assert outcome.rounds > REPEAT_ROUNDS + 4, outcome  # the window was passed
            for k, code in enumerate(codes):  # the old value and its update, both kept
                assert any(fact(k, code) in text for text in stored)
                assert any(fact(k, code + 1) in text for text in stored)
            await temporal.get_workflow_handle(clients[0].workflow_id(user)).terminate("test over")
    total = sum(len(v) for v in said.values())
    reliability.record(
        request,
        key="long-history-repeats",
        kind="fault",
        what=f"{ROUNDS} rounds for one user (repeat window {REPEAT_ROUNDS}) by two writers "
        "(summarisation, trimming) and two worker processes; early facts updated past the "
        "window; round 5's exchange told again in a new thread",
        happened=f"{total} lines said, each stored once; {outcome.rounds} rounds; the repeat "
        "accepted and indexed, stored once",
        outcome=outcome,
        started=started,
    )
