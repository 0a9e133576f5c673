"""The probe server and readiness checks, in process (no services)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

from mnemoflow.worker.health import HttpEndpoint, Readiness, probe_routes


def _get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    return await asyncio.to_thread(_get, port, path, method)


async def _ok() -> None:
    return None


async def _hang() -> None:
    await asyncio.Event().wait()


async def _boom() -> None:
    raise ConnectionError("refused")


async def test_live_before_any_check_ready_only_when_all_pass() -> None:
    readiness = Readiness(timeout_s=0.2)
    async with HttpEndpoint("127.0.0.1", 0, probe_routes(readiness)) as endpoint:
        assert await get(endpoint.port, "/healthz") == (200, "ok\n")
        code, body = await get(endpoint.port, "/readyz")
        assert code == 503 and json.loads(body)["checks"] == {"startup": "not connected yet"}

        readiness.add("temporal", _ok)
        readiness.add("redis", _ok)
        code, body = await get(endpoint.port, "/readyz?verbose=1")
        assert code == 200 and json.loads(body)["ready"] is True

        readiness.add("milvus", _hang)
        readiness.add("polling", _boom)
        code, body = await get(endpoint.port, "/readyz")
        checks = json.loads(body)["checks"]
        assert code == 503
        assert checks["milvus"] == "timed out after 0.2s"
        assert checks["polling"] == "ConnectionError: refused"
        assert checks["temporal"] == "ok"


async def test_draining_is_never_ready_and_unknown_paths_are_404() -> None:
    readiness = Readiness()
    readiness.add("temporal", _ok)
    async with HttpEndpoint("127.0.0.1", 0, probe_routes(readiness)) as endpoint:
        assert (await get(endpoint.port, "/readyz"))[0] == 200
        readiness.drain()
        assert (await get(endpoint.port, "/readyz"))[0] == 503
        assert (await get(endpoint.port, "/healthz"))[0] == 200  # still alive while draining
        assert (await get(endpoint.port, "/metrics"))[0] == 404
        assert (await get(endpoint.port, "/healthz", "POST"))[0] == 405


async def test_a_check_returning_false_is_not_ready() -> None:
    readiness = Readiness()

    async def no() -> bool:
        return False

    readiness.add("polling", no)
    assert await readiness.report() == (False, {"polling": "not ready"})
