"""The worker's probe and scrape endpoints, served by aiohttp.

- `/healthz` (liveness) answers 200 from the event loop itself: if it answers, the loop runs.
- `/readyz` (readiness) answers 200 only when every registered check passes within its
  timeout (Temporal, Milvus, Redis, the Workers polling), 503 with the failing checks before
  the worker is up and from the moment a shutdown starts.
- `/metrics` when the process exports metrics (see `mnemoflow.worker.metrics.render`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from aiohttp import web

from mnemoflow.worker.web import serving

log = logging.getLogger(__name__)

#: A route: returns (status code, content type, body).
Handler = Callable[[], Awaitable[tuple[int, str, bytes]]]
Check = Callable[[], Awaitable[object]]


class Readiness:
    """Named async checks; ready when there is at least one and all of them pass."""

    def __init__(self, timeout_s: float = 3.0) -> None:
        self.timeout_s = timeout_s
        self._checks: dict[str, Check] = {}
        self._draining = False

    def add(self, name: str, check: Check) -> None:
        """Register a check (it passes when it returns without raising, within the timeout)."""
        self._checks[name] = check

    def drain(self) -> None:
        """From now on never ready: the process is shutting down."""
        self._draining = True

    async def _run(self, check: Check) -> str:
        try:
            result = await asyncio.wait_for(check(), self.timeout_s)
        except TimeoutError:
            return f"timed out after {self.timeout_s:g}s"
        except Exception as err:
            return f"{type(err).__name__}: {err}"[:300]
        return "ok" if result is not False else "not ready"

    async def report(self) -> tuple[bool, dict[str, str]]:
        """(ready, check name -> "ok" or why not)."""
        if self._draining:
            return False, {"shutdown": "draining"}
        if not self._checks:
            return False, {"startup": "not connected yet"}
        names = list(self._checks)
        results = await asyncio.gather(*(self._run(self._checks[n]) for n in names))
        checks = dict(zip(names, results, strict=True))
        return all(r == "ok" for r in results), checks


def probe_routes(readiness: Readiness) -> dict[str, Handler]:
    """`/healthz` and `/readyz` for a Readiness."""

    async def healthz() -> tuple[int, str, bytes]:
        return 200, "text/plain", b"ok\n"

    async def readyz() -> tuple[int, str, bytes]:
        ready, checks = await readiness.report()
        body = json.dumps({"ready": ready, "checks": checks}, sort_keys=True).encode() + b"\n"
        return (200 if ready else 503), "application/json", body

    return {"/healthz": healthz, "/readyz": readyz}


class HttpEndpoint:
    """An aiohttp server for a fixed set of GET routes (HEAD included; other methods 405)."""

    def __init__(self, host: str, port: int, routes: dict[str, Handler]) -> None:
        self.host = host
        self.port = port
        self.routes = routes
        self._stack: AsyncExitStack | None = None

    async def start(self) -> HttpEndpoint:
        """Bind and serve in the background; port 0 picks a free port (see `self.port`)."""
        app = web.Application()
        for path, handler in self.routes.items():
            app.router.add_get(path, _respond(handler))
        stack = AsyncExitStack()
        self.port = await stack.enter_async_context(serving(app, self.host, self.port))
        self._stack = stack
        return self

    async def stop(self) -> None:
        """Stop listening and close open connections."""
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None

    async def __aenter__(self) -> HttpEndpoint:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _respond(handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def respond(request: web.Request) -> web.Response:
        status, ctype, body = await handler()
        # The type as given, parameters included (Prometheus reads `version=0.0.4`).
        return web.Response(status=status, body=body, headers={"Content-Type": ctype})

    return respond
