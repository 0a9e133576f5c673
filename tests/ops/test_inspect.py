"""`mnemoflow inspect` and `mnemoflow forget` against real services, configured by environment."""

from __future__ import annotations

import time
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models import search_attributes as sa
from mnemoflow.ops.inspect import forget_user, inspect_user, render
from mnemoflow.worker.settings import Settings
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import memory_worker


async def test_inspect_then_forget_a_user(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"ines-{uuid.uuid4().hex[:6]}"
        lines = ["Hello, I'm Ines and my order 7001 is late.", "Checking 7001."]
        handle = await submit(
            dev_env.client, mw.task_queue, user, conversation("t", lines, time.time() - 7200)
        )
        await wait_status(handle, lambda s: s.inductions >= 1, deadline_s=60)
        for name, value in {
            "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
            "TEMPORAL_TASK_QUEUE": mw.task_queue,
            "MILVUS_URI": milvus_uri,
            "MILVUS_COLLECTION": mw.store.collection,
            "MILVUS_EMBEDDING": "hashing",
            "REDIS_URL": redis_url,
            "REDIS_KEY_PREFIX": mw.read_model.prefix,
            "MNEMOFLOW_DATA_DIR": str(tmp_path),
        }.items():
            monkeypatch.setenv(name, value)
        settings = Settings.load()

        report = await inspect_user(settings, user)
        assert report["workflow"] == "running"
        assert report["profile"]["name"] == "Ines"
        assert report["fragments"] and all(f["id"] for f in report["fragments"])
        first = report["rounds"][0]
        assert first["status"] == "completed" and first["theme"] in sa.THEME_VOCABULARY
        assert report["costs"]["by_operation"]["slice"]["calls"] >= 1
        text = render(report)
        assert "7001" in text and "#1 completed" in text and f"({first['theme']})" in text

        receipt = await forget_user(settings, user, "test")
        assert receipt["fragments_deleted"] == len(report["fragments"])
        after = await inspect_user(settings, user)
        assert after["fragments"] == [] and not after["profile"]
