"""`mnemoflow -v worker` never logs what users said (issue 29, item 14).

A real `mnemoflow -v worker` process with encryption keys off (the case where Temporal's
payloads are plain JSON): a conversation with distinct, secret-looking lines goes through a
round (slice, index, publish), then the worker stops and its whole log is read. The Temporal
SDK's DEBUG lines quoted activity completions with their results, and so the conversation;
`-v` now turns only mnemoflow's own loggers to DEBUG.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.support.drive import conversation, submit, wait_status
from tests.support.invariants import secrets_in
from tests.support.reliability import Ledger
from tests.support.worker_cli import WorkerProcess, worker_env

pytestmark = pytest.mark.integration


async def test_verbose_worker_logs_no_conversation_text(
    tmp_path: Path,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    tag = uuid.uuid4().hex[:10]
    planted = [f"pin-{tag}-4417", f"passphrase-{tag}-violet", f"iban-{tag}-DE89"]
    lines = [
        f"My card pin is {planted[0]}, keep it.",
        "Noted.",
        f"And my passphrase is {planted[1]} with account {planted[2]}.",
        "Understood.",
    ]
    address = dev_env.client.service_client.config.target_host
    proc = WorkerProcess(tmp_path, worker_env(address, milvus_uri, redis_url), "verbose", ["-v"])
    try:
        await proc.wait_until("/readyz", 200)
        turns = conversation("t", lines, time.time() - 3 * 3600)
        handle = await submit(dev_env.client, proc.task_queue, f"verbose-{tag}", turns, urgent=True)
        status = await wait_status(
            handle, lambda s: s.rounds_completed == 1, deadline_s=90, what="a round"
        )
        assert status.watermarks["t"].indexed == len(lines)
        await handle.terminate("test done")
        proc.popen.send_signal(signal.SIGTERM)
        assert await proc.exit_code(30) == 0
        log = proc.log(0)
    finally:
        proc.stop()
    quoted = [line for line in log.splitlines() if any(p in line for p in planted)]
    assert quoted == [], f"{len(quoted)} lines, e.g. {quoted[0][:300]}"
    assert secrets_in(log, planted).clean
    assert " DEBUG " in log, log[-2000:]  # -v was on
    reliability.record(
        request,
        key="verbose-worker-log",
        kind="bad input",
        what=f"`mnemoflow -v worker` without encryption keys, {len(planted)} secret-looking "
        f"values in {len(lines)} lines through a round",
        happened=f"{len(quoted)} log lines quote them (the SDK's DEBUG output stays off under "
        "-v; mnemoflow's DEBUG is on)",
        outcome=secrets_in(log, planted),
        started=started,
    )
