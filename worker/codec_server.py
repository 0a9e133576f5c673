"""The remote codec endpoint: authorised operators read encrypted payloads in the UI and CLI.

Temporal's Web UI and `temporal` CLI (`--codec-endpoint URL --codec-auth "Bearer TOKEN"`) POST
`{"payloads": [...]}` (proto3 JSON of `temporal.api.common.v1.Payloads`) to `/decode` (or
`/encode`) with an `X-Namespace` header and show what comes back; the server itself only ever
stores ciphertext. Every POST needs `Authorization: Bearer <MNEMOFLOW_CODEC_TOKEN>`: missing ->
401, wrong -> 403 (compared in constant time). The configured UI origins get CORS headers,
including the OPTIONS preflight that browsers send before a POST with an Authorization header.

Served by aiohttp. A request is authorised from its headers before its body is read (a refused
upload costs no memory), bodies are capped at MAX_BODY_BYTES (413) and at most MAX_CONCURRENT
authorised requests run at once (503 past it); anything unexpected is answered with a 4xx.
Connections are bounded whoever opens them, authorised or not (`worker.web.ConnectionLimits`):
at most MAX_CONNECTIONS open (past it a 503 and the connection closed), a request head must be
complete within HEAD_TIMEOUT_S of the connection's opening or of its previous answer (a
trickled head and an idle keep-alive connection are closed then), and an authorised body must
arrive within BODY_TIMEOUT_S (408).

A payload sealed with the data key of a forgotten user (`worker.data_keys`) cannot be decoded
by anyone; /decode answers it with a `json/plain` string that starts with "[key destroyed]"
(metadata `mnemoflow-key-destroyed: true`), which the UI and `temporal workflow show` print
in its place, and decodes the rest of the page as usual.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from mnemoflow.worker.codec import CodecError, payload_codec
from mnemoflow.worker.settings import TemporalSettings
from mnemoflow.worker.web import ConnectionLimits, serving

log = logging.getLogger(__name__)

#: Largest request body: a page of history payloads (Temporal caps each payload at 2 MB).
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Authorised requests served at once; past it 503. With the body cap this bounds the memory
#: the server spends on bodies (refused requests never read theirs).
MAX_CONCURRENT = 8
#: Connections open at once, authorised or not; past it a 503 and the connection is closed.
MAX_CONNECTIONS = 64
#: A request head must be complete this long after the connection opened or its previous
#: answer was given; an idle keep-alive connection is closed after this long too.
HEAD_TIMEOUT_S = 5.0
#: An authorised request's body must arrive within this long (408 otherwise).
BODY_TIMEOUT_S = 10.0
#: An idle keep-alive connection is closed after this long (the head timeout comes first).
KEEPALIVE_S = HEAD_TIMEOUT_S
CORS_HEADERS = {
    "Access-Control-Allow-Methods": "POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Namespace",
    "Access-Control-Allow-Credentials": "true",
    "Access-Control-Max-Age": "600",
}


class HTTPError(Exception):
    """An error response: status and a short message (never secret material)."""

    def __init__(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass
class CodecServer:
    """The codec protocol over a PayloadCodec; `token` None = no authentication (loopback dev)."""

    codec: PayloadCodec
    token: str | None
    origins: Sequence[str] = ()
    namespace: str = "default"
    max_body: int = MAX_BODY_BYTES
    max_concurrent: int = MAX_CONCURRENT
    max_connections: int = MAX_CONNECTIONS
    head_timeout_s: float = HEAD_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    _busy: int = field(default=0, init=False)

    def app(self) -> web.Application:
        """The aiohttp application: POST and OPTIONS on /encode and /decode."""
        # client_max_size also bounds a chunked body, which announces no length up front.
        app = web.Application(client_max_size=self.max_body, middlewares=[self._envelope])
        for path, method in (("/encode", self.codec.encode), ("/decode", self.codec.decode)):
            app.router.add_post(path, self._coding(method))
            app.router.add_route("OPTIONS", path, _preflight)
        return app

    @web.middleware
    async def _envelope(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every answer, errors included, as JSON with the CORS headers the origin may have."""
        cors = self._cors(request.headers.get("Origin"))
        try:
            response: web.StreamResponse = await handler(request)
        except HTTPError as err:
            response = _error(err.status, str(err), err.headers)
        except web.HTTPException as err:  # the framework's 404, 405, 413
            status = HTTPStatus(err.status)
            extra = {"Allow": err.headers["Allow"]} if "Allow" in err.headers else {}
            message = {404: "the codec routes are /encode and /decode", 405: "use POST"}
            response = _error(status, message.get(err.status, status.phrase), extra)
        except Exception:
            log.exception("codec request failed")
            response = web.Response(status=HTTPStatus.INTERNAL_SERVER_ERROR)
        response.headers.update(cors)
        return response

    def _cors(self, origin: str | None) -> dict[str, str]:
        if origin is None or origin.rstrip("/") not in self.origins:
            return {}  # the browser then refuses to hand the answer to the page
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin", **CORS_HEADERS}

    def _coding(self, method: Callable[[Sequence[Payload]], Awaitable[list[Payload]]]) -> Any:
        async def handle(request: web.Request) -> web.Response:
            # Headers first: a request that is refused never has its body read.
            self._authorise(request.headers)
            length = request.content_length
            if length is not None and length > self.max_body:
                raise HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {self.max_body}")
            if self._busy >= self.max_concurrent:
                raise HTTPError(
                    HTTPStatus.SERVICE_UNAVAILABLE, "too many requests", {"Retry-After": "1"}
                )
            self._busy += 1  # held until the answer is built: the body lives that long
            try:
                try:
                    body = await asyncio.wait_for(request.read(), self.body_timeout_s)
                except TimeoutError:
                    raise HTTPError(
                        HTTPStatus.REQUEST_TIMEOUT, f"body not sent within {self.body_timeout_s} s"
                    ) from None
                return await self._code(body, method)
            finally:
                self._busy -= 1

        return handle

    @staticmethod
    async def _code(
        body: bytes, method: Callable[[Sequence[Payload]], Awaitable[list[Payload]]]
    ) -> web.Response:
        try:
            payloads = json_format.Parse(body, Payloads())
        except json_format.ParseError as err:
            message = f"body is not Payloads JSON: {err}"
            raise HTTPError(HTTPStatus.BAD_REQUEST, message) from None
        try:
            result = await method(payloads.payloads)
        except CodecError as err:
            raise HTTPError(HTTPStatus.UNPROCESSABLE_ENTITY, str(err)) from None
        body = json_format.MessageToJson(Payloads(payloads=result)).encode()
        return web.Response(body=body, content_type="application/json")

    def _authorise(self, headers: Mapping[str, str]) -> None:
        if self.token is not None:
            self._check_token(headers.get("Authorization"))
        namespace = headers.get("X-Namespace")
        if namespace is not None and namespace != self.namespace:
            raise HTTPError(HTTPStatus.FORBIDDEN, f"this codec serves namespace {self.namespace}")

    def _check_token(self, supplied: str | None) -> None:
        assert self.token is not None
        if not supplied:
            raise HTTPError(
                HTTPStatus.UNAUTHORIZED, "bearer token required", {"WWW-Authenticate": "Bearer"}
            )
        scheme, _, token = supplied.partition(" ")
        expected = self.token.encode()
        # compare_digest on bytes: constant time, and no error for non-ASCII input.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            raise HTTPError(HTTPStatus.FORBIDDEN, "invalid token")


async def _preflight(request: web.Request) -> web.Response:
    # Carries no credentials by design; the envelope adds the CORS headers for allowed origins.
    return web.Response(status=HTTPStatus.NO_CONTENT)


def _error(status: HTTPStatus, message: str, headers: dict[str, str]) -> web.Response:
    body = json.dumps({"error": message})
    return web.Response(status=status, text=body, content_type="application/json", headers=headers)


def build_codec_server(
    settings: TemporalSettings, *, extra_origins: Sequence[str] = (), require_token: bool = True
) -> CodecServer:
    """The codec server for these settings; refuses to run without keys (or token, if required)."""
    encryption = settings.encryption
    if not encryption.enabled:
        raise ValueError(
            "no encryption key configured (MNEMOFLOW_ENCRYPTION_KEYS): nothing to decode"
        )
    token = encryption.codec_token.get_secret_value() if encryption.codec_token else None
    if token is None and require_token:
        raise ValueError("MNEMOFLOW_CODEC_TOKEN is not set: the codec server needs a bearer token")
    origins = [*encryption.cors_origins(), *(o.rstrip("/") for o in extra_origins)]
    # A payload whose user data key is destroyed decodes to a readable "[key destroyed]" string.
    codec = payload_codec(encryption, placeholders=True)
    return CodecServer(codec, token, origins, settings.namespace)


@asynccontextmanager
async def running_codec_server(server: CodecServer, host: str, port: int) -> AsyncIterator[int]:
    """Listen on host:port for the duration of the block (port 0 = any free port); yields the
    bound port."""
    from mnemoflow.worker.data_keys import close_codec

    try:
        limits = ConnectionLimits(server.max_connections, server.head_timeout_s)
        keepalive = min(KEEPALIVE_S, server.head_timeout_s)
        async with serving(
            server.app(), host, port, limits=limits, keepalive_timeout=keepalive
        ) as bound:
            yield bound
    finally:
        await close_codec(server.codec)


async def serve_codec(settings: TemporalSettings, host: str, port: int) -> int:
    """`mnemoflow codec-server`: serve until SIGINT/SIGTERM."""
    import signal

    server = build_codec_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with running_codec_server(server, host, port) as bound:
        origins = ", ".join(server.origins) or "none"
        print(f"codec server on http://{host}:{bound} (UI origins: {origins})", flush=True)
        await stop.wait()
    return 0
