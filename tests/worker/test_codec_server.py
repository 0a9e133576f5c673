"""The codec endpoint over real HTTP: bearer token, CORS, decode/encode, rotation, and the CLI.

Each test starts the server on a free loopback port; the last one points the real `temporal`
CLI at it to show a history from the dev server in plaintext.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from google.protobuf import json_format
from pydantic import SecretStr
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from mnemoflow.devstack.temporal_dev import dev_server_argv, temporal_binary
from mnemoflow.ops import cli
from mnemoflow.worker.codec import EncryptionCodec, Keyring, data_converter
from mnemoflow.worker.codec_server import build_codec_server, running_codec_server
from mnemoflow.worker.settings import EncryptionSettings, TemporalSettings

K1, K2 = os.urandom(32), os.urandom(32)
TOKEN = "codec-test-token"
UI = "http://127.0.0.1:8233"


def keys(*pairs: tuple[str, bytes]) -> str:
    return ",".join(f"{kid}:{base64.b64encode(key).decode()}" for kid, key in pairs)


def temporal_settings(key_list: str, active: str | None = None, **more: object) -> TemporalSettings:
    encryption = EncryptionSettings(
        encryption_keys=SecretStr(key_list),
        encryption_active_key=active,
        codec_token=SecretStr(TOKEN),
        codec_cors_origins=f"{UI}/, https://ui.example",
        **more,
    )
    return TemporalSettings(encryption=encryption)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def payloads(self) -> list[Payload]:
        return list(json_format.Parse(self.body, Payloads()).payloads)


@dataclass
class Endpoint:
    port: int

    async def call(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        def call() -> Reply:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                conn.request(method, path, body=body or None, headers=headers or {})
                resp = conn.getresponse()
                return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
            finally:
                conn.close()

        return await asyncio.to_thread(call)

    async def post(
        self, path: str, payloads: list[Payload], token: str | None = TOKEN, **headers: str
    ) -> Reply:
        body = json_format.MessageToJson(Payloads(payloads=payloads)).encode()
        sent = {"Content-Type": "application/json", "X-Namespace": "default", **headers}
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        return await self.call("POST", path, body, sent)


@pytest_asyncio.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    """A codec server on the rotated keyring: k1 retired (decode only), k2 active."""
    server = build_codec_server(temporal_settings(keys(("k1", K1), ("k2", K2)), active="k2"))
    async with running_codec_server(server, "127.0.0.1", 0) as port:
        yield Endpoint(port)


def plain(text: str) -> Payload:
    return pydantic_data_converter.payload_converter.to_payloads([text])[0]


async def sealed_with_k1(text: str) -> Payload:
    return (await EncryptionCodec(Keyring("k1", {"k1": K1})).encode([plain(text)]))[0]


async def test_missing_token_is_401_and_wrong_token_403(endpoint: Endpoint) -> None:
    sealed = [await sealed_with_k1("hidden")]
    missing = await endpoint.post("/decode", sealed, token=None)
    assert missing.status == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert (await endpoint.post("/decode", sealed, token="guess")).status == 403
    assert (await endpoint.post("/decode", sealed, token=TOKEN + "x")).status == 403
    basic = await endpoint.post("/decode", sealed, token=None, Authorization=f"Basic {TOKEN}")
    assert basic.status == 403
    for reply in (missing, basic):
        assert b"hidden" not in reply.body


async def test_decode_with_the_token_returns_plaintext_even_for_a_retired_key(
    endpoint: Endpoint,
) -> None:
    old = await sealed_with_k1("sealed before the rotation to k2")
    reply = await endpoint.post("/decode", [old, plain("never encrypted")])
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    assert reply.payloads() == [plain("sealed before the rotation to k2"), plain("never encrypted")]


async def test_encode_uses_the_active_key_and_decodes_back(endpoint: Endpoint) -> None:
    sealed = await endpoint.post("/encode", [plain("round trip")])
    assert sealed.status == 200
    assert sealed.payloads()[0].metadata["encryption-key-id"] == b"k2"
    assert b"round trip" not in sealed.body
    opened = await endpoint.post("/decode", sealed.payloads())
    assert opened.payloads() == [plain("round trip")]


async def test_cors_preflight_and_headers_for_the_ui_origin_only(endpoint: Endpoint) -> None:
    preflight = await endpoint.call(
        "OPTIONS",
        "/decode",
        headers={
            "Origin": UI,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,x-namespace",
        },
    )
    assert preflight.status == 204
    assert preflight.headers["access-control-allow-origin"] == UI
    assert preflight.headers["access-control-allow-headers"] == (
        "Authorization, Content-Type, X-Namespace"
    )
    assert preflight.headers["access-control-allow-credentials"] == "true"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    # The UI must be able to read a refusal too, or it cannot tell the operator why.
    refused = await endpoint.post("/decode", [plain("x")], token=None, Origin=UI)
    assert refused.status == 401 and refused.headers["access-control-allow-origin"] == UI
    stranger = await endpoint.call("OPTIONS", "/decode", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in stranger.headers


async def test_bad_requests_get_clear_4xx(endpoint: Endpoint) -> None:
    unknown = (await EncryptionCodec(Keyring("k9", {"k9": os.urandom(32)})).encode([plain("x")]))[0]
    reply = await endpoint.post("/decode", [unknown])
    assert reply.status == 422 and b"k9" in reply.body
    garbage = await endpoint.call(
        "POST", "/decode", b"{not json", {"Authorization": f"Bearer {TOKEN}"}
    )
    assert garbage.status == 400
    assert (await endpoint.post("/decode", [plain("x")], **{"X-Namespace": "other"})).status == 403
    assert (await endpoint.call("GET", "/decode")).status == 405
    assert (await endpoint.post("/elsewhere", [plain("x")])).status == 404


def test_refuses_to_serve_without_keys_or_token() -> None:
    with pytest.raises(ValueError, match="no encryption key"):
        build_codec_server(TemporalSettings(encryption=EncryptionSettings()))
    no_token = TemporalSettings(
        encryption=EncryptionSettings(encryption_keys=SecretStr(keys(("k1", K1))))
    )
    with pytest.raises(ValueError, match="MNEMOFLOW_CODEC_TOKEN"):
        build_codec_server(no_token)
    assert build_codec_server(no_token, require_token=False).token is None  # loopback dev


def test_cli_command_without_token_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(os.environ):
        if name.startswith(("MNEMOFLOW_", "TEMPORAL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("MNEMOFLOW_ENCRYPTION_KEYS", keys(("k1", K1)))
    monkeypatch.setenv("MNEMOFLOW_USER_KEY_SECRET", "codec-test-secret")
    assert cli.main(["codec-server", "--port", "0"]) == 2
    assert "MNEMOFLOW_CODEC_TOKEN" in capsys.readouterr().err


def test_dev_server_gets_the_ui_codec_endpoint() -> None:
    argv = dev_server_argv(7233, 8233, "t.db", {}, ui_codec_endpoint="http://127.0.0.1:8234")
    assert argv[argv.index("--ui-codec-endpoint") + 1] == "http://127.0.0.1:8234"
    assert "--ui-codec-endpoint" not in dev_server_argv(7233, 8233, "t.db", {})
    headless = dev_server_argv(7233, None, "t.db", {}, ui_codec_endpoint="http://x")
    assert "--ui-codec-endpoint" not in headless


def payload_texts(cli_json: str) -> str:
    """The payload data in `temporal workflow show -o json` output (base64 there), decoded."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("data"), str) and "metadata" in node:
                found.append(base64.b64decode(node["data"]).decode(errors="replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(cli_json))
    return "\n".join(found)


@pytest.mark.integration
async def test_temporal_cli_shows_plaintext_only_through_the_codec(
    dev_env: WorkflowEnvironment, endpoint: Endpoint
) -> None:
    secret = f"the vault combination is 31-41-59-{uuid.uuid4().hex[:8]}"
    sealed_client = await Client.connect(
        dev_env.client.service_client.config.target_host,
        namespace=dev_env.client.namespace,
        data_converter=data_converter(temporal_settings(keys(("k1", K1))).encryption),
    )
    workflow_id = f"codec-cli-{uuid.uuid4().hex[:8]}"
    # No worker polls this queue: the started event alone carries the (sealed) input.
    handle = await sealed_client.start_workflow(
        "NobodyRunsThis", secret, id=workflow_id, task_queue=f"idle-{uuid.uuid4().hex[:8]}"
    )
    try:
        base = [
            temporal_binary(),
            "workflow",
            "show",
            "--workflow-id",
            workflow_id,
            "--address",
            dev_env.client.service_client.config.target_host,
            "--namespace",
            dev_env.client.namespace,
            "--output",
            "json",
        ]
        codec = ["--codec-endpoint", f"http://127.0.0.1:{endpoint.port}"]

        def show(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*base, *extra], capture_output=True, text=True, timeout=60, check=False
            )

        without = await asyncio.to_thread(show)
        assert without.returncode == 0, without.stderr
        assert "31-41-59" not in payload_texts(without.stdout)
        assert base64.b64encode(b"binary/encrypted").decode() in without.stdout
        with_codec = await asyncio.to_thread(show, *codec, "--codec-auth", f"Bearer {TOKEN}")
        assert with_codec.returncode == 0, with_codec.stderr
        assert secret in payload_texts(with_codec.stdout)
        # The CLI retries a refused decode until its deadline: keep that short.
        refused = (*codec, "--codec-auth", "Bearer nope", "--command-timeout", "2s")
        wrong = await asyncio.to_thread(show, *refused)
        assert wrong.returncode != 0 and secret not in wrong.stdout + wrong.stderr
    finally:
        await handle.terminate("test done")
