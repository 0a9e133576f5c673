"""Serving an aiohttp application for the duration of a block: the probe, metrics and codec
endpoints all run this way (parsing, limits and keep-alive are the framework's, not ours)."""

from __future__ import annotations

import logging
import socket
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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (the OS picks it; a race with others is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _paths(app: web.Application) -> set[str]:
    return {r.resource.canonical for r in app.router.routes() if r.resource is not None}
