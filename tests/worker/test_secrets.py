"""Planted secrets never come out: not in `Settings.redacted()`, repr or dumps, not in any log
line of a real `mnemoflow worker` run (a round included), not on /metrics, not in the dev
stack's printout or its stack.json.

Every form a secret takes in settings is planted: a URL's user-info password, `?password=`,
`?token=` and `?api_key=` query parameters, and every secret setting (Milvus token, DeepSeek and
Temporal API keys, codec token, encryption keys, the user-key secret).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.devstack.processes import LOOPBACK, free_port, redis_server_binary, start_process
from mnemoflow.devstack.stack import stack_path
from mnemoflow.worker.client import connect
from mnemoflow.worker.data_keys import close_codec
from mnemoflow.worker.settings import EncryptionSettings, Settings, TemporalSettings
from tests.support.drive import conversation, submit, wait_status
from tests.support.invariants import said_vs_stored
from tests.support.reliability import Ledger
from tests.support.worker_cli import ROOT, WorkerProcess, get, worker_env

TAG = uuid.uuid4().hex[:8]
REDIS_PASSWORD = f"redis-userinfo-{TAG}"
ENCRYPTION_KEY = base64.b64encode(os.urandom(32)).decode()
#: Planted secret -> where it goes (the process runs take the ones they can use).
SECRETS = {
    "redis-query": f"redis-query-{TAG}",
    "redis-userinfo": REDIS_PASSWORD,
    "milvus-token": f"milvus-token-{TAG}",
    "milvus-query": f"milvus-query-{TAG}",
    "deepseek": f"deepseek-key-{TAG}",
    "deepseek-url": f"deepseek-url-{TAG}",
    "temporal": f"temporal-key-{TAG}",
    "codec": f"codec-token-{TAG}",
    "encryption": ENCRYPTION_KEY,
    "user-key": f"user-key-{TAG}",
}
#: The secrets a worker process can run with (no Temporal API key: that means TLS).
PROCESS_ENV = {
    "MILVUS_TOKEN": f"root:{SECRETS['milvus-token']}",
    "DEEPSEEK_API_KEY": SECRETS["deepseek"],
    "MNEMOFLOW_MODELS": "heuristic",
    "MNEMOFLOW_CODEC_TOKEN": SECRETS["codec"],
    "MNEMOFLOW_ENCRYPTION_KEYS": f"k1:{ENCRYPTION_KEY}",
    "MNEMOFLOW_USER_KEY_SECRET": SECRETS["user-key"],
}


def leaks(text: str) -> list[str]:
    """The planted secrets found in `text` (by name)."""
    return [name for name, secret in SECRETS.items() if secret in text]


def test_settings_summaries_repr_and_dumps_show_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    planted = {
        **PROCESS_ENV,
        "REDIS_URL": f"redis://app:{REDIS_PASSWORD}@10.0.0.5:6379/0?password="
        f"{SECRETS['redis-query']}",
        "MILVUS_URI": f"https://milvus.example:443/?token={SECRETS['milvus-query']}",
        "DEEPSEEK_BASE_URL": f"https://llm.example/v1?api_key={SECRETS['deepseek-url']}",
        "TEMPORAL_API_KEY": SECRETS["temporal"],
    }
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    settings = Settings.load()
    assert settings.redis.url.endswith(SECRETS["redis-query"])  # the value itself is intact
    shown = {
        "redacted": json.dumps(settings.redacted(), default=str),
        "repr": repr(settings),
        "str": str(settings),
        "dump": settings.model_dump_json(),
    }
    for what, text in shown.items():
        assert leaks(text) == [], (what, text)
    redacted = settings.redacted()
    assert redacted["redis"]["url"] == "redis://app:***@10.0.0.5:6379/0?password=***"
    assert redacted["deepseek"]["api_key"] == "set"


def _redis_with_password(tmp: Path) -> tuple[object, int]:
    port = free_port()
    argv = [redis_server_binary(), "--bind", LOOPBACK, "--port", str(port), "--save", ""]
    argv += ["--dir", str(tmp), "--requirepass", REDIS_PASSWORD]
    return start_process("redis-auth", argv, port, tmp), port


@pytest.mark.integration
async def test_a_worker_run_logs_and_serves_no_secret(
    tmp_path: Path,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    redis, port = await asyncio.to_thread(_redis_with_password, tmp_path)
    # The user-info password is the server's; redis-py prefers it to the `?password=` one.
    url = f"redis://default:{REDIS_PASSWORD}@{LOOPBACK}:{port}/0?password={SECRETS['redis-query']}"
    address = dev_env.client.service_client.config.target_host
    env = worker_env(address, milvus_uri, url, **PROCESS_ENV)
    proc = WorkerProcess(tmp_path, env, "secrets")
    try:
        await proc.wait_until("/readyz", 200)
        encryption = EncryptionSettings(encryption_keys=SecretStr(f"k1:{ENCRYPTION_KEY}"))
        # The worker seals each user's payloads with that user's data key, kept in its Redis.
        encryption = encryption.with_data_keys_store(url, env["REDIS_KEY_PREFIX"])
        client = await connect(TemporalSettings(address=address, encryption=encryption))
        lines = ["My order 5512 is late.", "Checking order 5512."]
        turns = conversation("t", lines, time.time() - 3 * 3600)
        user = f"secret-{TAG}"
        handle = await submit(client, proc.task_queue, user, turns, urgent=True)
        done = await wait_status(
            handle, lambda s: s.rounds_completed == 1, deadline_s=90, what="round"
        )
        # The worker's run stored what was said, once: redacting its output lost nothing.
        store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=env["MILVUS_COLLECTION"])
        try:
            outcome = await said_vs_stored(store, user, done, {"t": lines})
        finally:
            await store.close()
        assert outcome.clean, outcome
        code, page = await get(proc.metrics_port, "/metrics")
        assert code == 200 and "mnemoflow_rounds_total" in page
        assert leaks(page) == []
        await handle.terminate("test done")
        await close_codec(client.data_converter.payload_codec)
        proc.popen.send_signal(signal.SIGTERM)
        assert await proc.exit_code(30) == 0
        log = proc.log(0)
        assert "settings:" in log and "password=***" in log
        assert leaks(log) == [], [line for line in log.splitlines() if leaks(line)]
    finally:
        proc.stop()
        redis.stop()  # type: ignore[attr-defined]
    reliability.record(
        request,
        key="secrets-in-logs",
        kind="bad input",
        what=f"{len(SECRETS)} planted secrets in every URL form (userinfo, password=/token=/"
        "api_key= query parameters) and in every secret setting, through a worker's run",
        happened="none appears in the worker's log lines, its settings line or /metrics; "
        "passwords are printed as ***",
        outcome=outcome,
        started=started,
    )


@pytest.mark.integration
async def test_the_dev_stack_prints_and_writes_no_secret(tmp_path: Path) -> None:
    data_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "MNEMOFLOW_"))}
    env = {k: v for k, v in env.items() if not k.startswith(("MILVUS_", "REDIS_", "DEEPSEEK_"))}
    env |= {**PROCESS_ENV, "MILVUS_EMBEDDING": "hashing"}
    argv = [sys.executable, "-m", "mnemoflow.ops.cli", "dev", "--data-dir", str(data_dir)]
    for name in ("temporal", "ui", "redis", "milvus"):
        argv += [f"--{name}-port", str(free_port())]
    log_path = tmp_path / "dev.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        stack_file = stack_path(data_dir)
        deadline = time.monotonic() + 120
        while not stack_file.exists():
            assert proc.returncode is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the dev stack did not come up"
            await asyncio.sleep(0.1)
        written = stack_file.read_text()
        assert "codec server" in log_path.read_text()  # encryption on: the printout names it
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        printed = log_path.read_text()
        assert leaks(written) == [], written
        assert leaks(printed) == [], [line for line in printed.splitlines() if leaks(line)]
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 30)
