"""The codec endpoint's limits: refused before the body is read, bodies capped, requests capped.

The flood test runs the real `mnemoflow codec-server` process and measures its resident memory
while 30 connections without a token announce multi-megabyte bodies.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from mnemoflow.devstack.processes import LOOPBACK, free_port, port_open
from mnemoflow.worker.codec_server import build_codec_server, running_codec_server
from mnemoflow.worker.settings import EncryptionSettings, TemporalSettings
from tests.support.invariants import no_messages
from tests.support.reliability import Ledger

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "limits-test-token"
KEYS = "k1:" + base64.b64encode(os.urandom(32)).decode()
#: A chunk of a body: what a client sends before it must have an answer.
CHUNK = 64 * 1024


def head(length: int, token: str | None = None) -> bytes:
    lines = [
        "POST /decode HTTP/1.1",
        f"Host: {LOOPBACK}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
    ]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_of(reader: asyncio.StreamReader) -> int:
    """The status code of the response on this connection (within 10 s)."""
    line = await asyncio.wait_for(reader.readline(), 10)
    assert line.startswith(b"HTTP/1.1 "), line
    return int(line.split()[1])


async def open_partial(port: int, length: int, token: str | None = None) -> tuple[
    asyncio.StreamReader, asyncio.StreamWriter
]:  # fmt: skip
    """A connection that announced `length` bytes of body and sent only the first chunk."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(head(length, token) + b"x" * min(CHUNK, length))
    await asyncio.wait_for(writer.drain(), 10)
    return reader, writer


@pytest.fixture
async def small_server() -> AsyncIterator[int]:
    """An in-process codec server that runs one authorised request at a time."""
    encryption = EncryptionSettings(encryption_keys=SecretStr(KEYS), codec_token=SecretStr(TOKEN))
    server = build_codec_server(TemporalSettings(encryption=encryption))
    server.max_concurrent = 1
    async with running_codec_server(server, LOOPBACK, 0) as port:
        yield port


async def test_too_large_is_413_before_the_body_and_refusal_needs_no_body(
    small_server: int,
) -> None:
    # Neither connection sends its announced body: the answer must come from the headers.
    reader, writer = await open_partial(small_server, 64 * 1024 * 1024, TOKEN)
    assert await status_of(reader) == 413
    writer.close()
    reader, writer = await open_partial(small_server, 3 * 1024 * 1024, token=None)
    assert await status_of(reader) == 401
    writer.close()


async def test_past_the_concurrency_cap_is_503_and_the_slot_comes_back(small_server: int) -> None:
    body = b'{"payloads": []}'
    # The first request holds the only slot: its body is still on the way.
    slow_reader, slow_writer = await asyncio.open_connection(LOOPBACK, small_server)
    slow_writer.write(head(len(body), TOKEN) + body[:4])
    await slow_writer.drain()

    async def second() -> int:
        reader, writer = await asyncio.open_connection(LOOPBACK, small_server)
        writer.write(head(len(body), TOKEN) + body)
        try:
            return await status_of(reader)
        finally:
            writer.close()

    # The slow request reaches its handler asynchronously; 503 once it holds the slot.
    deadline = time.monotonic() + 10
    while (code := await second()) != 503:
        assert code == 200 and time.monotonic() < deadline, code
        await asyncio.sleep(0.05)
    slow_writer.write(body[4:])
    assert await status_of(slow_reader) == 200
    slow_writer.close()
    assert await second() == 200


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
async def test_thirty_unauthenticated_large_uploads_get_401_and_cost_no_memory(
    tmp_path: Path, reliability: Ledger, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MNEMOFLOW_", "TEMPORAL_"))}
    env.update(
        MNEMOFLOW_ENCRYPTION_KEYS=KEYS, MNEMOFLOW_CODEC_TOKEN=TOKEN, MNEMOFLOW_USER_KEY_SECRET="s"
    )
    log = (tmp_path / "codec.log").open("wb")
    argv = ["-m", "mnemoflow.ops.cli", "codec-server", "--port", str(port)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(port_open, LOOPBACK, port):
            assert proc.returncode is None, (tmp_path / "codec.log").read_text()
            assert time.monotonic() < deadline, "codec server did not start"
            await asyncio.sleep(0.05)
        before = rss_kib(proc.pid)
        # 30 clients at once, each announcing 3 MB (under the cap) and sending 64 KB of it.
        conns = await asyncio.gather(*(open_partial(port, 3 * 1024 * 1024) for _ in range(30)))
        codes = await asyncio.gather(*(status_of(reader) for reader, _ in conns))
        assert codes == [401] * 30
        grown_mib = (rss_kib(proc.pid) - before) / 1024
        for _, writer in conns:
            writer.close()
        # Reading the bodies would take 90 MB (the hand-written server grew by ~450 MB).
        print(f"codec server RSS grew by {grown_mib:.1f} MiB")
        assert grown_mib < 20, f"RSS grew by {grown_mib:.1f} MiB"
        reliability.record(
            request,
            key="codec-unauthenticated-flood",
            kind="bad input",
            what="30 connections to the codec server at once, no token, each announcing a "
            "3 MB body and sending 64 KB of it",
            happened=f"all 30 got 401 before their bodies were read; RSS grew {grown_mib:.1f} MiB",
            outcome=no_messages(),  # no message in play: the codec server's own bound
            started=started,
        )
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        log.close()
