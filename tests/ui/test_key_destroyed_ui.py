"""A forgotten user's history in the real Temporal Web UI: "[key destroyed]", not their words.

The dev server's UI decodes payloads through the codec endpoint (`--ui-codec-endpoint`, CORS for
the UI's origin). After a forget the old run of the user workflow shows the codec server's
placeholder where the input was; another user's workflow still shows its text. Headless
Chromium as in test_temporal_ui.py (skipped when it is not installed).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from urllib.parse import quote

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.devstack.processes import LOOPBACK, free_port
from mnemoflow.devstack.temporal_dev import start_temporal_dev
from mnemoflow.middleware import MemoryClient
from mnemoflow.worker.app import Components, running_worker
from mnemoflow.worker.client import connect
from mnemoflow.worker.codec_server import build_codec_server, running_codec_server
from mnemoflow.worker.data_keys import close_codec
from mnemoflow.worker.search_attributes import wanted
from tests.support.drive import eventually
from tests.support.memory_worker import fresh_settings
from tests.support.operations import settled, turns
from tests.ui.test_temporal_ui import SCREENSHOTS, chromium, render
from tests.workflows.test_forget_shredding import encrypted_settings, word


async def test_the_ui_shows_key_destroyed_for_a_forgotten_user(
    tmp_path: Path, milvus_uri: str, redis_url: str
) -> None:
    binary = chromium()
    rng = random.Random()
    gone, kept = word(rng), word(rng)
    port, ui_port, codec_port = free_port(), free_port(), free_port()
    ui_origin = f"http://{LOOPBACK}:{ui_port}"
    settings = encrypted_settings(fresh_settings(milvus_uri, redis_url), f"{LOOPBACK}:{port}")
    codec = build_codec_server(settings.temporal, extra_origins=[ui_origin], require_token=False)
    server = await asyncio.to_thread(
        start_temporal_dev,
        port,
        ui_port,
        tmp_path / "temporal.db",
        wanted(),
        ui_codec_endpoint=f"http://{LOOPBACK}:{codec_port}",
    )
    try:
        client = await connect(settings.temporal)
        components = Components(models=HeuristicMemoryModels(), embeddings=HashingEmbeddings())
        async with (
            running_worker(client, settings, components),
            running_codec_server(codec, LOOPBACK, codec_port),
        ):
            memory = MemoryClient(
                temporal=client,
                task_queue=settings.temporal.task_queue,
                key_prefix=settings.redis.key_prefix,
                user_key_secret="operator-secret",
            )
            victim, other = f"vera-{word(rng)}", f"otto-{kept}"  # its input names it
            await memory.submit(victim, turns("t", [f"{gone.title()} {gone} {gone}.", "Noted."]))
            await memory.submit(other, turns("t", [f"{kept.title()} {kept} {kept}.", "Noted."]))
            await settled(memory, victim, 1)
            await settled(memory, other, 1)
            victim_wid, other_wid = memory.workflow_id(victim), memory.workflow_id(other)
            old_run = (await client.get_workflow_handle(victim_wid).describe()).run_id
            assert (await memory.forget(victim)).keys_destroyed == 1

            async def continued() -> bool:
                desc = await client.get_workflow_handle(victim_wid).describe()
                return desc.run_id != old_run

            await eventually(continued, deadline_s=30, what="the user workflow continued as new")
            other_run = (await client.get_workflow_handle(other_wid).describe()).run_id
            # Closed runs only: the UI keeps polling a running one, and the page never settles.
            for wid in (victim_wid, other_wid):
                await client.get_workflow_handle(wid).terminate("test finished")

            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            ui = f"{ui_origin}/namespaces/default/workflows"
            shots = [
                ("key-destroyed.png", victim_wid, old_run),
                ("readable.png", other_wid, other_run),
            ]
            doms = []
            for shot, wid, run in shots:
                url = f"{ui}/{quote(wid, safe='')}/{run}/history"
                doms.append(
                    await asyncio.to_thread(
                        render, binary, url, tmp_path / "chromium", SCREENSHOTS / shot
                    )
                )
            forgotten, readable = doms
            assert "[key destroyed]" in forgotten
            assert gone not in forgotten
            assert kept in readable and "[key destroyed]" not in readable
            print(f"screenshots: {SCREENSHOTS}/key-destroyed.png, {SCREENSHOTS}/readable.png")
            await memory.aclose()
        await close_codec(client.data_converter.payload_codec)
    finally:
        await asyncio.to_thread(server.stop, 15)
