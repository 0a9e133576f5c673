"""The remote codec endpoint: authorised operators read encrypted payloads in the UI and CLI.

Temporal's Web UI and `temporal` CLI (`--codec-endpoint URL --codec-auth "Bearer TOKEN"`) POST
`{"payloads": [...]}` (proto3 JSON of `temporal.api.common.v1.Payloads`) to `/decode` (or
`/encode`) with an `X-Namespace` header and show what comes back; the server itself only ever
stores ciphertext. Every POST needs `Authorization: Bearer <MNEMOFLOW_CODEC_TOKEN>`: missing ->
401, wrong -> 403 (compared in constant time). The configured UI origins get CORS headers,
including the OPTIONS preflight that browsers send before a POST with an Authorization header.

A small HTTP/1.1 server on asyncio streams (one request per connection), because the protocol
is two routes and the venv has no web framework; anything unexpected is answered with a 4xx.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from http import HTTPStatus

from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads
from temporalio.converter import PayloadCodec

from mnemoflow.worker.codec import CodecError, EncryptionCodec, Keyring
from mnemoflow.worker.settings import TemporalSettings

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024  # a page of history payloads; Temporal caps each at 2 MB
REQUEST_TIMEOUT_S = 30.0
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
class Request:
    """The parts of a request the codec protocol needs (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass
class CodecServer:
    """The codec protocol over a PayloadCodec; `token` None = no authentication (loopback dev)."""

    codec: PayloadCodec
    token: str | None
    origins: Sequence[str] = ()
    namespace: str = "default"

    async def respond(self, request: Request) -> tuple[HTTPStatus, dict[str, str], bytes]:
        """Status, headers and body answering `request` (CORS headers included when allowed)."""
        cors = self._cors(request.headers.get("origin"))
        try:
            status, headers, body = await self._route(request)
        except HTTPError as err:
            body = json.dumps({"error": str(err)}).encode()
            status, headers = err.status, {"Content-Type": "application/json", **err.headers}
        except Exception:
            log.exception("codec request failed")
            status, headers, body = HTTPStatus.INTERNAL_SERVER_ERROR, {}, b""
        return status, {**cors, **headers}, body

    def _cors(self, origin: str | None) -> dict[str, str]:
        if origin is None or origin.rstrip("/") not in self.origins:
            return {}  # the browser then refuses to hand the answer to the page
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin", **CORS_HEADERS}

    async def _route(self, request: Request) -> tuple[HTTPStatus, dict[str, str], bytes]:
        path = request.path.split("?", 1)[0].rstrip("/")
        handlers = {"/encode": self.codec.encode, "/decode": self.codec.decode}
        if path not in handlers:
            raise HTTPError(HTTPStatus.NOT_FOUND, "the codec routes are /encode and /decode")
        if request.method == "OPTIONS":  # preflight: carries no credentials by design
            return HTTPStatus.NO_CONTENT, {}, b""
        if request.method != "POST":
            raise HTTPError(HTTPStatus.METHOD_NOT_ALLOWED, "use POST", {"Allow": "POST, OPTIONS"})
        self._authorise(request.headers)
        try:
            payloads = json_format.Parse(request.body, Payloads())
        except json_format.ParseError as err:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"body is not Payloads JSON: {err}") from None
        try:
            result = await handlers[path](payloads.payloads)
        except CodecError as err:
            raise HTTPError(HTTPStatus.UNPROCESSABLE_ENTITY, str(err)) from None
        body = json_format.MessageToJson(Payloads(payloads=result)).encode()
        return HTTPStatus.OK, {"Content-Type": "application/json"}, body

    def _authorise(self, headers: dict[str, str]) -> None:
        if self.token is not None:
            self._check_token(headers.get("authorization"))
        namespace = headers.get("x-namespace")
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

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one request on a connection, then close it."""
        try:
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    request = await _read_request(reader)
                status, headers, body = await self.respond(request)
            except HTTPError as err:
                status, headers = err.status, {"Content-Type": "application/json"}
                body = json.dumps({"error": str(err)}).encode()
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                return
            writer.write(_response(status, headers, body))
            await writer.drain()
        except Exception:  # one bad connection must not take the server down
            log.exception("codec connection failed")
        finally:
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> Request:
    try:
        line = (await reader.readline()).decode("latin-1").strip()
        method, target, _version = line.split(" ", 2)
        headers: dict[str, str] = {}
        while (header := (await reader.readline()).decode("latin-1").strip()) != "":
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
    except (ValueError, asyncio.LimitOverrunError):
        raise HTTPError(HTTPStatus.BAD_REQUEST, "malformed request") from None
    length = headers.get("content-length")
    if method == "POST" and length is None:
        raise HTTPError(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
    size = int(length) if length and length.isdigit() else 0
    if size > MAX_BODY_BYTES:
        raise HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
    body = await reader.readexactly(size) if size else b""
    return Request(method.upper(), target, headers, body)


def _response(status: HTTPStatus, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status.value} {status.phrase}"]
    head = {**headers, "Content-Length": str(len(body)), "Connection": "close"}
    lines += [f"{name}: {value}" for name, value in head.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def build_codec_server(
    settings: TemporalSettings, *, extra_origins: Sequence[str] = (), require_token: bool = True
) -> CodecServer:
    """The codec server for these settings; refuses to run without keys (or token, if required)."""
    encryption = settings.encryption
    keyring = Keyring.from_settings(encryption)
    if keyring is None:
        raise ValueError(
            "no encryption key configured (MNEMOFLOW_ENCRYPTION_KEYS): nothing to decode"
        )
    token = encryption.codec_token.get_secret_value() if encryption.codec_token else None
    if token is None and require_token:
        raise ValueError("MNEMOFLOW_CODEC_TOKEN is not set: the codec server needs a bearer token")
    origins = [*encryption.cors_origins(), *(o.rstrip("/") for o in extra_origins)]
    return CodecServer(EncryptionCodec(keyring), token, origins, settings.namespace)


@asynccontextmanager
async def running_codec_server(
    server: CodecServer, host: str, port: int
) -> AsyncIterator[asyncio.Server]:
    """Listen on host:port for the duration of the block (port 0 = any free port)."""
    listener = await asyncio.start_server(server.handle, host, port)
    try:
        yield listener
    finally:
        listener.close()
        await listener.wait_closed()


async def serve_codec(settings: TemporalSettings, host: str, port: int) -> int:
    """`mnemoflow codec-server`: serve until SIGINT/SIGTERM."""
    import signal

    server = build_codec_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with running_codec_server(server, host, port):
        origins = ", ".join(server.origins) or "none"
        print(f"codec server on http://{host}:{port} (UI origins: {origins})", flush=True)
        await stop.wait()
    return 0
