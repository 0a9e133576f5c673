"""A slice the model refuses for good keeps its turns verbatim, on the dev server.

A provider answers HTTP 400 to a conversation its content filter flags, or to one longer than its
window, and a model may never make its output valid. Each is a permanent error: the round failed,
and the next round, after the back-off, sent the same oldest turns again, so the thread never
moved on and everything said on it after them waited for ever. Now the refused turns are kept
verbatim (each sentence once, with its speaker), the round completes, and the next turns are
sliced by the model as before.
"""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.base import SlicedDrafts, TunedRaw
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.memory.params import renormalise
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ActivityName, SliceOutput, TuneOutput
from mnemoflow.models.errors import MalformedModelOutputError
from mnemoflow.models.round_store import SLICE_AND_TUNE, SliceTuneOutput
from mnemoflow.models.turns import ChatTurn
from mnemoflow.worker.metrics import MnemoflowMetrics
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import memory_worker

FLAGGED = "Kestrel"  # a word the provider's content filter refuses (HTTP 400)
GARBLED = "Quokka"  # turns on which the model never answers valid output


class ContentRisk(Exception):
    status_code = 400  # what an openai-style client raises for a flagged prompt


class AuthRejected(Exception):
    status_code = 401


class PickyModels(HeuristicMemoryModels):
    def __init__(self) -> None:
        super().__init__()
        self.slices: list[int] = []
        self.refusals = 0

    async def slice(self, turns: list[ChatTurn], max_fragments: int) -> SlicedDrafts:
        self.slices.append(len(turns))
        text = " ".join(t.content for t in turns)
        if FLAGGED in text:
            self.refusals += 1
            raise ContentRisk("Content Exists Risk")
        if GARBLED in text:
            raise MalformedModelOutputError("not JSON")
        return await super().slice(turns, max_fragments)

    async def tune(self, theme: str, samples: list[str], types: list[str]) -> TunedRaw:
        if FLAGGED in " ".join(samples):  # the filter refuses the theme's fragments too
            self.refusals += 1
            raise ContentRisk("Content Exists Risk")
        return await super().tune(theme, samples, types)


def lines(tag: str, n: int, odd: str = "") -> list[str]:
    said = [f"{tag} line {k}: shelf {k * 7 + 3} holds crate {tag}-{k * 11 + 5}." for k in range(n)]
    if odd:
        said[2] = f"{tag} line 2: the {odd} report is on shelf 44."
    return said


@pytest.mark.parametrize("odd", [FLAGGED, GARBLED], ids=["content-filter", "never-valid"])
async def test_refused_turns_are_kept_verbatim_and_the_thread_moves_on(
    odd: str,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    models = PickyModels()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = f"picky-{uuid.uuid4().hex[:6]}"
        t0 = time.time() - 4 * 86_400
        first, second = lines("Alpha", 6, odd), lines("Beta", 4)
        config = MemoryConfig.from_vocation("customer service").model_copy(
            update={"failed_round_backoff_s": 1.0}
        )
        with caplog.at_level(logging.ERROR, logger="mnemoflow.activities.llm_activities"):
            handle = await submit(
                mw.client, mw.task_queue, user, conversation("t", first, t0), urgent=True,
                config=config,
            )  # fmt: skip
            await wait_status(handle, lambda s: s.rounds_completed == 1, deadline_s=90)
            later = conversation("t", second, t0 + 3600)
            for turn in later:
                turn.position += len(first)
            await submit(mw.client, mw.task_queue, user, later, urgent=True, config=config)
            st = await wait_status(
                handle,
                lambda s: s.rounds_completed == 2 and s.pending_turns == 0,
                deadline_s=90,
                what="the turns after the refused ones",
            )
        assert st.rounds_failed == 0 and st.watermarks["t"].indexed == len(first) + len(second)
        stored = [f.content for f in await mw.store.all_for_user(user)]
        counts = {line: sum(text.count(line) for text in stored) for line in first + second}
        assert [n for n in counts.values() if n != 1] == [], counts
        refused = [r.getMessage() for r in caplog.records if "kept verbatim" in r.getMessage()]
        assert len(refused) == 1 and user in refused[0], refused
        if odd == FLAGGED:
            tunes = [r.getMessage() for r in caplog.records if "tune refused" in r.getMessage()]
            assert len(tunes) >= 1 and models.refusals == 1 + len(tunes)
        assert len(models.slices) >= 2 and models.slices[-1] == len(second), models.slices


def test_a_refusal_is_counted_and_an_ordinary_call_is_not() -> None:
    metrics = MnemoflowMetrics()
    metrics.activity_result(ActivityName.SLICE, SliceOutput(drafts=[], refused="InvalidInput: x"))
    metrics.activity_result(ActivityName.SLICE, SliceOutput(drafts=[]))
    refused_tune = TuneOutput(params=renormalise({}), refused="InvalidInput: y")
    metrics.activity_result(ActivityName.TUNE, refused_tune)
    both = SliceTuneOutput(
        sliced=SliceOutput(drafts=[], refused="MalformedModelOutput: z"),
        tuned={"a": refused_tune, "b": TuneOutput(params=renormalise({}))},
    )
    metrics.activity_result(SLICE_AND_TUNE, both)
    counted = metrics.llm_refusals.labels
    assert (counted(operation="slice")._value.get(), counted(operation="tune")._value.get()) == (
        2,
        2,
    )
