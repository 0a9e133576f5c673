"""The codec endpoint bounds connections, not only authorised requests (issue 29, item 10).

Real sockets on 127.0.0.1 against the codec server (limits lowered so the test takes seconds):
a request head trickled a byte at a time, an idle keep-alive connection after a 401, more
connections than the cap, and an authorised body that never arrives. Each is closed or
answered within its bound, and the server still answers an authorised request afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from mnemoflow.devstack.processes import LOOPBACK
from mnemoflow.worker.codec_server import CodecServer, build_codec_server, running_codec_server
from mnemoflow.worker.settings import EncryptionSettings, TemporalSettings
from tests.support.invariants import no_messages
from tests.support.reliability import Ledger
from tests.worker.test_codec_limits import KEYS, TOKEN, head, status_of

HEAD_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 6
BODY = b'{"payloads": []}'


@pytest.fixture
async def served() -> AsyncIterator[tuple[CodecServer, int]]:
    encryption = EncryptionSettings(encryption_keys=SecretStr(KEYS), codec_token=SecretStr(TOKEN))
    server = build_codec_server(TemporalSettings(encryption=encryption))
    server.head_timeout_s = HEAD_TIMEOUT_S
    server.body_timeout_s = HEAD_TIMEOUT_S
    server.max_connections = MAX_CONNECTIONS
    async with running_codec_server(server, LOOPBACK, 0) as port:
        yield server, port


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> float | None:
    """Seconds until the server closed the connection (EOF), None if it was still open after
    `seconds`; whatever it answered meanwhile is read and dropped."""
    return (await answer_and_close(reader, seconds))[0]


async def answer_and_close(
    reader: asyncio.StreamReader, seconds: float
) -> tuple[float | None, bytes]:
    """(seconds until the server closed the connection or None, the bytes it sent)."""
    start = time.monotonic()
    end = start + seconds
    got = b""
    while (left := end - time.monotonic()) > 0:
        try:
            data = await asyncio.wait_for(reader.read(4096), left)
        except TimeoutError:
            return None, got
        except ConnectionResetError:
            return time.monotonic() - start, got
        if not data:
            return time.monotonic() - start, got
        got += data
    return None, got


async def authorised(port: int) -> int:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        writer.write(head(len(BODY), TOKEN) + BODY)
        return await status_of(reader)
    finally:
        writer.close()


async def test_a_trickled_head_and_an_idle_keepalive_connection_are_closed(
    served: tuple[CodecServer, int],
) -> None:
    _, port = served
    # A head sent a byte every 0.2 s never completes: closed at the head timeout.
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    trickle = head(0)

    async def send_slowly() -> None:
        for byte in trickle:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.2)

    sender = asyncio.create_task(send_slowly())
    try:
        assert await closed_within(reader, HEAD_TIMEOUT_S * 4) is not None
    finally:
        sender.cancel()
        writer.close()
    # A keep-alive connection left idle after its (refused) request: closed too.
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(head(0))
    assert await status_of(reader) == 401
    assert await closed_within(reader, HEAD_TIMEOUT_S * 4) is not None
    writer.close()
    assert await authorised(port) == 200


async def test_past_the_connection_cap_is_503_and_closed(
    served: tuple[CodecServer, int], reliability: Ledger, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    _, port = served
    opened = MAX_CONNECTIONS * 3
    conns = []
    for _ in range(opened):  # idle connections that never send a byte
        conns.append(await asyncio.open_connection(LOOPBACK, port))
    # Each connection is either refused at once (a 503, then closed) or let in and closed at
    # the head timeout without a byte: told apart by what it received, not by timing.
    outcomes = await asyncio.gather(*(answer_and_close(r, HEAD_TIMEOUT_S * 6) for r, _ in conns))
    refused = sum(1 for _, got in outcomes if got.startswith(b"HTTP/1.1 503"))
    idle_closed = sum(1 for closed, got in outcomes if closed is not None and got == b"")
    assert (refused, idle_closed) == (opened - MAX_CONNECTIONS, MAX_CONNECTIONS)
    for _, writer in conns:
        writer.close()
    assert await authorised(port) == 200
    # An authorised body that never arrives: 408 at the body timeout, and the slot comes back.
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(head(len(BODY), TOKEN) + BODY[:3])
    assert await status_of(reader) == 408
    writer.close()
    assert await authorised(port) == 200
    reliability.record(
        request,
        key="codec-idle-connections",
        kind="bad input",
        what=f"{opened} idle connections at once to a codec server capped at {MAX_CONNECTIONS}, "
        "a request head trickled a byte at a time, an idle keep-alive connection, an "
        "authorised body that never arrives",
        happened=f"{refused} got 503 and were closed at once, {idle_closed} idle ones closed at "
        f"the {HEAD_TIMEOUT_S:.0f} s head timeout (also the trickled head and the idle "
        "keep-alive one), the body 408; authorised requests answered after each",
        outcome=no_messages(),
        started=started,
    )
