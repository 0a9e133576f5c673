"""Every form a URL carries a password in is masked wherever mnemoflow prints or logs it
(issue 29, item 15): `user:pass@`, `:pass@` and a bare `pass@` (Redis takes
`redis://password@host`), percent-encoded or not; in settings printouts, CLI error lines and
any log line or traceback that quotes the URL; and in a real `mnemoflow worker` process's log.
"""

from __future__ import annotations

import asyncio
import io
import logging
import signal
import time
import uuid
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from mnemoflow.devstack.processes import LOOPBACK, free_port
from mnemoflow.ops.cli import _service_problem
from mnemoflow.worker.redact import LogRedactor, mask_url, mask_urls_in
from mnemoflow.worker.settings import Settings
from tests.support.invariants import secrets_in
from tests.support.reliability import Ledger
from tests.support.worker_cli import WorkerProcess, worker_env

SECRET = f"hunter2-{uuid.uuid4().hex[:8]}"

FORMS = {
    f"redis://{SECRET}@cache.internal:6379/0": "redis://***@cache.internal:6379/0",
    f"redis://app:{SECRET}@cache.internal:6379/0": "redis://app:***@cache.internal:6379/0",
    f"redis://:{SECRET}@cache.internal:6379/0": "redis://:***@cache.internal:6379/0",
    f"rediss://{SECRET}@cache.internal:6380/1?ssl_cert_reqs=none": (
        "rediss://***@cache.internal:6380/1?ssl_cert_reqs=none"
    ),
    f"redis://a%40b:{SECRET}%40x@cache.internal/0": "redis://a%40b:***@cache.internal/0",
    f"redis://{SECRET}%3Ax@[::1]:6379/0": "redis://***@[::1]:6379/0",
    f"http://{SECRET}@milvus.internal:19530": "http://***@milvus.internal:19530",
    f"redis://cache.internal:6379/0?password={SECRET}": "redis://cache.internal:6379/0?password=***",
    "redis://cache.internal:6379/0": "redis://cache.internal:6379/0",
}


@pytest.mark.parametrize("url", list(FORMS))
def test_every_userinfo_form_is_masked(url: str) -> None:
    assert mask_url(url) == FORMS[url]
    text = f"cannot reach {url}, giving up"
    assert mask_urls_in(text) == f"cannot reach {FORMS[url]}, giving up"


def test_settings_and_cli_errors_print_no_bare_userinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", f"redis://{SECRET}@cache.internal:6379/0")
    monkeypatch.setenv("MILVUS_URI", f"http://{SECRET}@milvus.internal:19530")
    settings = Settings.load()
    shown = [repr(settings), str(settings), settings.model_dump_json(), str(settings.redacted())]
    problem = _service_problem(RedisConnectionError("connection refused"), settings)
    shown.append(problem)
    assert [text for text in shown if SECRET in text] == []
    assert "redis://***@cache.internal:6379/0" in problem


def test_log_lines_and_tracebacks_are_masked() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(LogRedactor())
    logger = logging.getLogger(f"test.redact.{uuid.uuid4().hex}")
    logger.addHandler(handler)
    logger.propagate = False
    url = f"redis://{SECRET}@cache.internal:6379/0"
    logger.warning("connecting to %s", url)
    try:
        raise OSError(f"Error connecting to {url}")
    except OSError:
        logger.exception("failed")
    text = stream.getvalue()
    assert SECRET not in text
    assert text.count("redis://***@cache.internal:6379/0") == 2  # the line, the error


@pytest.mark.integration
async def test_a_worker_process_logs_no_bare_userinfo(
    tmp_path: Path, reliability: Ledger, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    # Nothing listens on either port: the worker logs its settings, then retries Temporal.
    redis = f"redis://{SECRET}@{LOOPBACK}:{free_port()}/0"
    env = worker_env(f"{LOOPBACK}:{free_port()}", f"http://{LOOPBACK}:{free_port()}", redis)
    proc = WorkerProcess(tmp_path, env, "redact", ["-v"])
    try:
        deadline = time.monotonic() + 60
        while "cannot reach Temporal" not in proc.log(0):
            assert proc.popen.poll() is None, proc.log()
            assert time.monotonic() < deadline, proc.log()
            await asyncio.sleep(0.1)
        proc.popen.send_signal(signal.SIGTERM)
        await proc.exit_code(30)
        log = proc.log(0)
    finally:
        proc.stop()
    leaked = [line for line in log.splitlines() if SECRET in line]
    assert "settings:" in log and f"redis://***@{LOOPBACK}" in log
    assert leaked == [], leaked[:3]
    reliability.record(
        request,
        key="redis-url-bare-userinfo",
        kind="bad input",
        what="REDIS_URL with the password as bare user-info (`redis://PASSWORD@host:port/0`) "
        "for a `mnemoflow -v worker` run, and every other user-info form in settings "
        "printouts, CLI errors, log lines and tracebacks",
        happened=f"printed as `redis://***@host`; {len(leaked)} log lines hold the password",
        outcome=secrets_in(log, [SECRET]),
        started=started,
    )
