"""Committed histories (tests/replay/*.json) replay without non-determinism.

They were recorded from real runs of the end-to-end tests (MNEMOFLOW_RECORD_REPLAY=1). A change
to workflows/ that breaks one of them breaks running user workflows in production: version it
with workflow.patched(), or record new histories when the change is deliberate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.replay import REPLAY_DIR, load_recorded, replayer

HISTORIES = sorted(REPLAY_DIR.glob("*.json"))


def test_histories_are_committed() -> None:
    kinds = {p.name.split("-")[0] for p in HISTORIES}
    assert {"timeskip", "pipeline", "requests"} <= kinds, (
        f"missing recorded histories in {REPLAY_DIR}"
    )


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays(path: Path) -> None:
    history = await asyncio.to_thread(load_recorded, path)
    await replayer().replay_workflow(history)
