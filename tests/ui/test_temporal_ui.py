"""The operator's view in the real Temporal UI, through headless Chromium.

Loads the workflow list filtered to one user's failed rounds and the page of a failed round,
checks the failure text is on the page, and saves screenshots under test-output/screenshots/.
Chromium comes from Debian (`make test` installs it when it can); without it this test is
skipped with the reason printed.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from mnemoflow.devstack.processes import free_port
from mnemoflow.devstack.temporal_dev import start_temporal_dev
from mnemoflow.middleware import MemoryClient
from mnemoflow.ops.operations import rounds_query
from mnemoflow.worker.search_attributes import wanted
from tests.support.memory_worker import memory_worker
from tests.support.operations import BreakableModels, settled, turns, visible

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    "--virtual-time-budget=20000",
]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (make test installs Debian's chromium when it can)")
    return found


def render(binary: str, url: str, profile: Path, shot: Path) -> str:
    """The page's DOM after its scripts ran, plus a screenshot of it: one Chromium run does
    both (a second launch loaded the UI again for the same page)."""
    argv = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    argv += [f"--screenshot={shot}", "--dump-dom", url]
    shot.unlink(missing_ok=True)
    done = subprocess.run(argv, capture_output=True, timeout=90, check=True)
    assert shot.exists(), done.stderr.decode("utf-8", "replace")[-2000:]
    return done.stdout.decode("utf-8", "replace")


async def test_failed_rounds_are_findable_and_readable_in_the_ui(
    tmp_path: Path, milvus_uri: str, redis_url: str
) -> None:
    binary = chromium()
    port, ui_port = free_port(), free_port()
    server = await asyncio.to_thread(
        start_temporal_dev, port, ui_port, tmp_path / "temporal.db", wanted()
    )
    try:
        temporal = await Client.connect(f"127.0.0.1:{port}", data_converter=pydantic_data_converter)
        async with memory_worker(
            temporal, milvus_uri=milvus_uri, redis_url=redis_url, models=BreakableModels()
        ) as mw:
            client = MemoryClient(temporal=temporal, task_queue=mw.task_queue)
            user = f"ui-operator-{uuid.uuid4().hex[:6]}"
            mw.track(client.workflow_id(user))
            await client.submit(user, turns("good", ["I'm Una, hello.", "Hi Una."]))
            await client.submit(user, turns("bad", ["FAIL-ME now", "ok"]))
            await settled(client, user, 2)
            failed_query = rounds_query(client.search_user(user), failed_only=True)
            [failed] = await visible(temporal, failed_query, 1)
            desc = await temporal.get_workflow_handle(failed.id).describe()

            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            ui = f"http://127.0.0.1:{ui_port}/namespaces/default"
            list_url = f"{ui}/workflows?query={quote(failed_query)}"
            page_url = f"{ui}/workflows/{quote(failed.id, safe='')}/{desc.run_id}/history"
            list_dom = await asyncio.to_thread(
                render, binary, list_url, tmp_path / "chromium", SCREENSHOTS / "failed-rounds.png"
            )
            page_dom = await asyncio.to_thread(
                render, binary, page_url, tmp_path / "chromium", SCREENSHOTS / "failed-round.png"
            )
            assert failed.id in list_dom
            assert "round-1" in list_dom or "round-2" in list_dom
            assert "slicer refuses this conversation" in page_dom
            assert (SCREENSHOTS / "failed-rounds.png").stat().st_size > 10_000
            print(f"screenshots: {SCREENSHOTS}/failed-rounds.png, {SCREENSHOTS}/failed-round.png")
            print(f"query: {failed_query}")
            await client.aclose()
    finally:
        await asyncio.to_thread(server.stop, 15)


def test_chromium_flags_keep_the_browser_off_the_network() -> None:
    assert "--disable-background-networking" in CHROMIUM_FLAGS
    assert time.time() > 0  # the test module imports and runs without chromium too
