"""The client's outbox on its own (docs/ARCHITECTURE.md, "Delivery"): what it sends, how often,
and what it keeps when sending fails. The sender is a function that records its calls and fails
while told to: the integration tests drive the real one against a stopped Temporal server."""

from __future__ import annotations

import asyncio

import pytest

from mnemoflow.middleware.outbox import Outbox
from mnemoflow.models.turns import ChatTurn
from mnemoflow.models.usage import LLMUsage
from tests.support.drive import eventually


def turn(i: int, thread: str = "t") -> ChatTurn:
    return ChatTurn(
        thread_id=thread, position=i, role="human", content=f"line {i}", time=float(i),
        message_id=f"m{i}",
    )  # fmt: skip


class Recorder:
    """A sender that records what it got, failing while `down` is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], LLMUsage | None]] = []
        self.down = False
        self.failures = 0

    async def __call__(
        self, uid: str, turns: list[ChatTurn], urgent: bool, trigger: str, usage: LLMUsage | None
    ) -> None:
        await asyncio.sleep(0.005)  # a send takes a moment: adds may land meanwhile
        if self.down:
            self.failures += 1
            raise ConnectionError("temporal down")
        self.calls.append((uid, [t.message_id for t in turns], usage))

    def delivered(self) -> list[str]:
        return [i for _, ids, _ in self.calls for i in ids]


async def test_each_message_and_each_usage_is_delivered_once() -> None:
    send = Recorder()
    box = Outbox(send)
    for i in range(5):
        box.add("u", [turn(i), turn(i)], hold=True)  # captured twice in one turn
        box.add("u", [turn(max(0, i - 1))], hold=True)  # and offered again by the next turn
        box.release("u", "t", chat_usage=LLMUsage(calls=1, input_tokens=10))
        await asyncio.sleep(0)
    assert await box.flush(5) == 0
    assert sorted(send.delivered()) == [f"m{i}" for i in range(5)]
    total = sum((u for _, _, u in send.calls if u is not None), LLMUsage())
    assert total == LLMUsage(calls=5, input_tokens=50)
    assert box.accepted("u", "t", ["m0", "m4", "m9"]) == {"m0", "m4"}
    box.add("u", [turn(3)])  # accepted before: not sent again
    assert await box.flush(1) == 0 and len(sorted(send.delivered())) == 5


async def test_a_hold_that_nobody_releases_ends_by_itself() -> None:
    send = Recorder()
    box = Outbox(send, max_hold_s=0.2)  # a turn that raised after its hand-overs were held
    box.add("u", [turn(0)], hold=True)

    async def delivered() -> bool:
        return send.delivered() == ["m0"]

    await eventually(delivered, deadline_s=5, what="the hold to expire")
    assert box.pending() == 0


async def test_held_messages_wait_for_release_or_flush() -> None:
    send = Recorder()
    box = Outbox(send)
    box.add("u", [turn(0)], hold=True)
    await asyncio.sleep(0.05)
    assert send.calls == [] and box.pending("u") == 1
    assert await box.flush(1) == 0  # a turn that failed midway: flush releases it
    assert send.delivered() == ["m0"]


async def test_a_failed_delivery_is_retried_in_the_background_until_accepted() -> None:
    send = Recorder()
    send.down = True
    box = Outbox(send, base_backoff_s=0.01, max_backoff_s=0.05)
    box.add("u", [turn(0), turn(1)])
    box.release("u", "t", chat_usage=LLMUsage(calls=1))
    assert await box.flush(0.3) == 2  # still down: kept, not dropped
    assert send.failures >= 2 and box.metrics.retries._value.get() == send.failures
    assert box.metrics.pending._value.get() == 2
    send.down = False

    async def delivered() -> bool:  # nobody calls flush or release: the retry is the outbox's
        return box.pending() == 0

    await eventually(delivered, deadline_s=5, what="background re-delivery")
    assert box.pending() == 0 and sorted(send.delivered()) == ["m0", "m1"]
    assert [u for _, _, u in send.calls] == [LLMUsage(calls=1)]  # usage once, after the outage
    assert await box.aclose(1) == 0


async def test_the_outbox_is_bounded_and_counts_what_it_refused() -> None:
    send = Recorder()
    send.down = True
    box = Outbox(send, max_messages=3, base_backoff_s=0.01, max_backoff_s=0.02)
    assert box.add("u", [turn(i) for i in range(5)]) == 3
    assert box.metrics.refused._value.get() == 2 and box.pending() == 3
    assert await box.aclose(0.05) == 3  # what stays undelivered is reported


async def test_the_outbox_is_bounded_in_bytes_too() -> None:
    send = Recorder()
    send.down = True
    box = Outbox(send, max_bytes=3 * (8000 + 64), base_backoff_s=0.01, max_backoff_s=0.02)
    big = [turn(i).model_copy(update={"content": "x" * 8000}) for i in range(5)]
    assert box.add("u", big) == 3 and box.metrics.refused._value.get() == 2
    send.down = False
    assert await box.flush(5) == 0
    assert box.add("u", [turn(9).model_copy(update={"content": "y" * 8000})]) == 1  # room again
    assert await box.aclose(5) == 0


def test_bounds_must_make_sense() -> None:
    with pytest.raises(ValueError):
        Outbox(Recorder(), max_messages=0)
    with pytest.raises(ValueError):
        Outbox(Recorder(), base_backoff_s=2, max_backoff_s=1)
    with pytest.raises(ValueError):
        Outbox(Recorder(), max_bytes=0)
