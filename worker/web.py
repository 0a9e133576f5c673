"""Serving an aiohttp application for the duration of a block: the probe, metrics and codec
endpoints all run this way (parsing, limits and keep-alive are the framework's, not ours)."""

from __future__ import annotations

import errno
import logging
import random
import socket
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

#: After answering a request whose body it did not read (a refused upload), the server drains
#: the rest for at most this long before closing the connection, so a refused client cannot
#: hold a connection open by trickling a large body.
LINGER_S = 1.0


@asynccontextmanager
async def serving(app: web.Application, host: str, port: int, **options: Any) -> AsyncIterator[int]:
    """Serve `app` on host:port (0 = any free port) inside the block; yields the bound port.

    `options` go to aiohttp's request handler (e.g. `keepalive_timeout`).
    """
    runner = web.AppRunner(app, access_log=None, lingering_time=LINGER_S, **options)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = int(runner.addresses[0][1])
        log.info("serving %s on http://%s:%d", sorted(_paths(app)), host, bound)
        yield bound
    finally:
        await runner.cleanup()


#: Where `free_port` looks: below Linux's default ephemeral range (32768-60999), and above the
#: ports services usually take. A port the OS hands out for port 0 comes from the ephemeral
#: range, where every outgoing connection also takes its local port: between choosing such a
#: port and a server binding it, a connection of any process could take it ("address already
#: in use"; seen once when a benchmark started its stack right after another had stopped).
FREE_PORT_RANGE = (20_000, 32_000)
#: Ports this process handed out lately, not handed out again (a caller may not have bound
#: the last one yet).
_handed_out: deque[int] = deque(maxlen=512)


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on host:port now. SO_REUSEADDR, as servers set it:
    connections lingering in TIME_WAIT do not count, a listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now, outside the range the OS takes outgoing connections'
    ports from (`FREE_PORT_RANGE`); the OS's own pick when none is found there. Another
    process may still bind it first: callers that start a server on it retry on failure."""
    rng = random.Random()
    low, high = FREE_PORT_RANGE
    for _ in range(64):
        port = rng.randint(low, high)
        if port not in _handed_out and bindable(port, host):
            _handed_out.append(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port = int(sock.getsockname()[1])
    _handed_out.append(port)
    return port


def _paths(app: web.Application) -> set[str]:
    return {r.resource.canonical for r in app.router.routes() if r.resource is not None}
