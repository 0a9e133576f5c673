"""The user workflow's rules patch: a run that recorded it asks no other patch
(workflows/user_state.py, RULES_PATCH); runs recorded before it still ask each one
(tests/replay, test_replay.py)."""

from __future__ import annotations

import ast
import importlib
import json
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import MemoryClient
from mnemoflow.models.contracts import UserStatus
from mnemoflow.workflows import user_state
from mnemoflow.workflows.user_state import PATCHES_APPLIED, RULES_PATCH
from tests.support.drive import eventually
from tests.support.memory_worker import memory_worker
from tests.support.operations import turns
from tests.support.replay import assert_replays

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"


def _asked_patches() -> tuple[set[str], list[str]]:
    """Every patch id the workflows pass to a `patched` call, and the calls that go to
    `workflow.patched` directly (file:line)."""
    ids: set[str] = set()
    direct: list[str] = []
    for path in sorted(WORKFLOWS.glob("*.py")):
        module = importlib.import_module(f"mnemoflow.workflows.{path.stem}")
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "patched"
            ):
                continue
            owner, [arg] = node.func.value, node.args
            if isinstance(arg, ast.Name):
                value = getattr(module, arg.id, None)
            elif isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
                value = getattr(getattr(module, arg.value.id), arg.attr)
            else:
                value = None
            if isinstance(owner, ast.Name) and owner.id == "workflow":
                direct.append(f"{path.name}:{node.lineno}")
                if value is None:  # UserRun.patched passing its argument on
                    continue
            assert isinstance(value, str), f"{path.name}:{node.lineno}: not a patch constant"
            ids.add(value)
    return ids, direct


#: Patches added after RULES_PATCH: asked in every run (PATCHES_APPLIED is never extended; a
#: rules patch of their own would cover them).
ASKED_IN_EVERY_RUN: set[str] = set()


def test_every_patch_the_user_workflow_asks_is_applied_under_the_rules() -> None:
    """Only UserRun asks `workflow.patched`; under RULES_PATCH it answers every patch of
    PATCHES_APPLIED without asking, and those are patches the workflows still ask about. A
    patch added since shows up here: list it in ASKED_IN_EVERY_RUN."""
    ids, direct = _asked_patches()
    assert direct and all(d.startswith("user_state.py:") for d in direct), direct
    assert set(PATCHES_APPLIED) <= ids, set(PATCHES_APPLIED) - ids
    assert ids - set(PATCHES_APPLIED) == {RULES_PATCH} | ASKED_IN_EVERY_RUN


def _patch_ids(history: object) -> list[str]:
    out = []
    for event in history.events:  # type: ignore[attr-defined]
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        attrs = event.marker_recorded_event_attributes
        if attrs.marker_name == "core_patch":
            out.append(json.loads(attrs.details["patch-data"].payloads[0].data)["id"])
    return out


@pytest.mark.parametrize("applied", [True, False], ids=["rules", "each-patch"])
async def test_a_new_run_records_one_patch_marker_whatever_it_does(
    applied: bool,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh history that numbers above the stores, remembers, makes rounds in two threads
    and forgets a fragment with its quotes (each of which asked patches before) records the
    rules marker only, and replays. With the rules applying nothing, the same run records a
    marker per patch it asks, as runs did before them."""
    if not applied:
        monkeypatch.setattr(user_state, "PATCHES_APPLIED", frozenset())  # the sandbox shares it
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        client = MemoryClient(temporal=dev_env.client, task_queue=mw.task_queue, redis=redis_url)
        user = f"rules-{uuid.uuid4().hex[:8]}"
        workflow_id = client.workflow_id(user)
        mw.track(workflow_id)
        await client.submit(user, turns("a", ["My name is Rune Aalto.", "Hello Rune."]))
        await client.submit(user, turns("b", ["I ordered a teal kayak.", "Noted, the kayak."]))
        remembered = await client.remember(user, "Rune's locker code is 4417.")
        box: dict[str, UserStatus | None] = {}

        async def rounds_done() -> bool:
            box["s"] = await client.status(user)
            s = box["s"]
            return bool(s and s.rounds_completed + s.rounds_failed >= 2)

        await eventually(rounds_done, deadline_s=60, what="2 rounds")
        status = box["s"]
        assert status is not None and status.rounds_completed == 2, status
        forgot = await client.forget_fragment(user, remembered.fragment_id, quotes=True)
        assert forgot.deleted == 1, forgot
        history = await dev_env.client.get_workflow_handle(workflow_id).fetch_history()
        asked = _patch_ids(history)
        upserts = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        ]
        if applied:
            assert asked == [RULES_PATCH]
            assert len(upserts) == 1, upserts  # the rules marker's TemporalChangeVersion
        else:
            # 8 in a run of this code: the fresh history's, the remember's, the forget's
            assert asked[0] == RULES_PATCH and len(set(asked) - {RULES_PATCH}) >= 5, asked
            assert len(upserts) >= 2, upserts
        if applied:  # the other is a made-up configuration: not a history to keep
            assert await assert_replays(dev_env.client, [workflow_id], name="rules-user") == 1
        await client.aclose()
