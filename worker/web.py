"""Serving an aiohttp application for the duration of a block: the probe, metrics and codec
endpoints all run this way (parsing, body limits and keep-alive are the framework's).

`ConnectionLimits` adds what the framework does not bound: how many connections are open at
once (past it a connection gets a 503 and is closed at once) and how long a connection may sit
without a request in progress, whether it trickles a request head (no header read timeout in
aiohttp) or idles between keep-alive requests (the codec server's, docs/PRIVACY.md).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import socket
import weakref
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger(__name__)

#: After answering a request whose body it did not read (a refused upload), the server drains
#: the rest for at most this long before closing the connection, so a refused client cannot
#: hold a connection open by trickling a large body.
LINGER_S = 1.0


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on connections, whoever opens them (refused and idle ones included)."""

    max_connections: int
    #: A connection's next request head must be complete within this long of its opening or of
    #: the answer to its previous request; otherwise it is closed (slow heads, idle keep-alive).
    head_timeout_s: float


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
    b"Connection: close\r\n\r\n"
)


class _ConnectionGuard:
    """Applies ConnectionLimits to an aiohttp Server through its connection hooks."""

    def __init__(self, server: web.Server, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open: dict[RequestHandler, asyncio.Transport] = {}
        self.timers: dict[RequestHandler, asyncio.TimerHandle] = {}
        self.refused = 0
        self.expired = 0
        made, lost = server.connection_made, server.connection_lost
        factory, handle = server.request_factory, server.request_handler

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            if len(self.open) >= limits.max_connections:
                self.refused += 1
                transport.write(_BUSY)
                transport.close()
                return
            self.open[handler] = transport
            self._arm(handler)

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            self._disarm(handler)
            self.open.pop(handler, None)
            lost(handler, exc)

        def request_factory(*args: Any, **kwargs: Any) -> web.BaseRequest:
            # A complete request head was read: the connection is busy, not idle.
            self._disarm(args[2] if len(args) > 2 else kwargs.get("protocol"))
            return factory(*args, **kwargs)

        async def request_handler(request: web.BaseRequest) -> web.StreamResponse:
            try:
                return await handle(request)
            finally:
                if request.protocol in self.open:
                    self._arm(request.protocol)  # the next head, or idle keep-alive, from now

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]
        server.request_factory = request_factory
        server.request_handler = request_handler

    def _arm(self, handler: RequestHandler) -> None:
        self._disarm(handler)
        loop = asyncio.get_running_loop()
        self.timers[handler] = loop.call_later(self.limits.head_timeout_s, self._expire, handler)

    def _disarm(self, handler: RequestHandler | None) -> None:
        timer = self.timers.pop(handler, None) if handler is not None else None
        if timer is not None:
            timer.cancel()

    def _expire(self, handler: RequestHandler) -> None:
        self.timers.pop(handler, None)
        transport = self.open.get(handler)
        if transport is not None:
            self.expired += 1
            handler.force_close()
            transport.close()


@asynccontextmanager
async def serving(
    app: web.Application,
    host: str,
    port: int,
    *,
    limits: ConnectionLimits | None = None,
    **options: Any,
) -> AsyncIterator[int]:
    """Serve `app` on host:port (0 = any free port) inside the block; yields the bound port.

    `options` go to aiohttp's request handler (e.g. `keepalive_timeout`); `limits` bound the
    connections (`ConnectionLimits`).
    """
    runner = web.AppRunner(app, access_log=None, lingering_time=LINGER_S, **options)
    await runner.setup()
    if limits is not None:
        assert runner.server is not None
        GUARDS[app] = _ConnectionGuard(runner.server, limits)
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = int(runner.addresses[0][1])
        log.info("serving %s on http://%s:%d", sorted(_paths(app)), host, bound)
        yield bound
    finally:
        await runner.cleanup()


#: The connection guard of each app served with limits (tests read its counts).
GUARDS: weakref.WeakKeyDictionary[web.Application, _ConnectionGuard] = weakref.WeakKeyDictionary()

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
