"""The worker's probe and scrape endpoints: a tiny HTTP/1.1 server on asyncio streams.

- `/healthz` (liveness) answers 200 from the event loop itself: if it answers, the loop runs.
- `/readyz` (readiness) answers 200 only when every registered check passes within its
  timeout (Temporal, Milvus, Redis, the Workers polling), 503 with the failing checks before
  the worker is up and from the moment a shutdown starts.
- `/metrics` when the process exports metrics (see `mnemoflow.worker.metrics.render`).

No web framework: three GET routes do not justify a dependency in the image.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

#: A route: returns (status code, content type, body).
Handler = Callable[[], Awaitable[tuple[int, str, bytes]]]
Check = Callable[[], Awaitable[object]]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
_MAX_HEADER_BYTES = 16384


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
    """A GET-only HTTP server for a fixed set of routes (one request per connection)."""

    def __init__(self, host: str, port: int, routes: dict[str, Handler]) -> None:
        self.host = host
        self.port = port
        self.routes = routes
        self._server: asyncio.Server | None = None

    async def start(self) -> HttpEndpoint:
        """Bind and serve in the background; port 0 picks a free port (see `self.port`)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("serving %s on http://%s:%d", sorted(self.routes), self.host, self.port)
        return self

    async def stop(self) -> None:
        """Stop listening and close open connections."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> HttpEndpoint:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            if len(head) > _MAX_HEADER_BYTES:
                return
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            status, ctype, body = await self._respond(method, path)
            reason = _REASONS.get(status, "")
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (body if method != "HEAD" else b"")
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client that sent no complete request gets no answer
        except ConnectionError:
            pass
        except Exception:
            log.exception("health endpoint failed to answer")
        finally:
            writer.close()

    async def _respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        handler = self.routes.get(path)
        if handler is None:
            return 404, "text/plain", b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n"
        return await handler()
