"""`mnemoflow dev`: the embedded stack in the foreground.

Starts, all on 127.0.0.1 and all with their files under the data dir: the Temporal dev server
(SQLite file, Web UI, mnemoflow search attributes, Task Failures view), a redis-server and a
Milvus Lite server, then one worker in this process. Prints the addresses, writes
`<data_dir>/stack.json` once everything answers, and on Ctrl-C or SIGTERM stops the worker
first (so running activities finish) and then every service it started, newest first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from temporalio.client import Client

from mnemoflow.devstack.processes import (
    LOOPBACK,
    ManagedProcess,
    MissingBinaryError,
    free_port,
    start_milvus_lite,
    start_redis,
)
from mnemoflow.devstack.stack import (
    StackInfo,
    leftover_services,
    read_stack,
    remove_stack,
    write_stack,
)
from mnemoflow.devstack.temporal_dev import start_temporal_dev
from mnemoflow.worker.client import connect_until
from mnemoflow.worker.search_attributes import ensure_search_attributes, wanted
from mnemoflow.worker.settings import Settings
from mnemoflow.worker.web import bindable

CONNECT_DEADLINE_S = 60.0
CONNECT_RETRY_S = 0.2
STOP_TIMEOUT_S = 15.0


class DevStackError(RuntimeError):
    """The dev stack cannot start (busy port, a stack already on the data dir, ...)."""


@dataclass(frozen=True)
class DevPorts:
    """Ports of the dev stack; None = the default if free, else any free port."""

    temporal: int | None = None
    ui: int | None = None
    redis: int | None = None
    milvus: int | None = None


DEFAULT_PORTS = DevPorts(temporal=7233, ui=8233, redis=6379, milvus=19530)


def choose_ports(requested: DevPorts) -> DevPorts:
    """Requested ports must be free; unrequested ones are the defaults, or free ones if busy."""
    chosen: dict[str, int] = {}
    for name in ("temporal", "ui", "redis", "milvus"):
        want = getattr(requested, name)
        if want is not None:
            if not bindable(want):
                raise DevStackError(f"{name} port {want} is busy")
            chosen[name] = want
            continue
        default = getattr(DEFAULT_PORTS, name)
        port = default if bindable(default) else free_port()
        while port in chosen.values():
            port = free_port()
        chosen[name] = port
    return replace(requested, **chosen)


async def _stop_all(procs: list[ManagedProcess]) -> None:
    # In parallel: each stop may wait up to STOP_TIMEOUT_S before it escalates to SIGKILL.
    await asyncio.gather(*(asyncio.to_thread(p.stop, STOP_TIMEOUT_S) for p in procs))


async def _start_services(
    data_dir: Path, ports: DevPorts, stack: AsyncExitStack, ui_codec_endpoint: str | None = None
) -> list[ManagedProcess]:
    """Start the three services in parallel; whatever started is registered for stopping."""
    assert ports.temporal and ports.redis and ports.milvus
    # The launchers block while polling their port; threads let the three start together.
    results = await asyncio.gather(
        asyncio.to_thread(start_redis, ports.redis, data_dir),
        asyncio.to_thread(start_milvus_lite, ports.milvus, data_dir),
        asyncio.to_thread(
            start_temporal_dev,
            ports.temporal,
            ports.ui,
            data_dir / "temporal.db",
            wanted(),
            ui_codec_endpoint=ui_codec_endpoint,
        ),
        return_exceptions=True,
    )
    started = [r for r in results if isinstance(r, ManagedProcess)]
    stack.push_async_callback(_stop_all, started)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return started


async def _start_codec_server(
    settings: Settings, ports: DevPorts, stack: AsyncExitStack
) -> str | None:
    """With encryption on, the codec server the Web UI decodes with; its URL (None = off)."""
    from mnemoflow.worker.codec_server import build_codec_server, running_codec_server

    encryption = settings.temporal.encryption
    if not encryption.enabled:
        return None
    port = encryption.codec_port
    if not bindable(port) or port in (
        ports.temporal,
        ports.ui,
        ports.redis,
        ports.milvus,
    ):
        port = free_port()
    ui_origins = (
        [f"http://{host}:{ports.ui}" for host in (LOOPBACK, "localhost")] if ports.ui else []
    )
    # Loopback only, like the dev server itself: without MNEMOFLOW_CODEC_TOKEN the dev UI (which
    # has no login to take a token from) can decode; with it, the token is enforced.
    server = build_codec_server(settings.temporal, extra_origins=ui_origins, require_token=False)
    await stack.enter_async_context(running_codec_server(server, LOOPBACK, port))
    url = f"http://{LOOPBACK}:{port}"
    auth = "bearer token required" if server.token else "no token: loopback only"
    print(f"  codec server  : {url}  ({auth})", flush=True)
    return url


def _print_addresses(info: StackInfo, stack_file: Path) -> None:
    lines = [
        "mnemoflow dev stack is up (Ctrl-C to stop everything)",
        f"  Temporal gRPC : {info.temporal_address}  (namespace {info.namespace})",
        f"  Temporal UI   : {info.ui_url or '(headless)'}",
        f"  Redis         : {info.redis_url}",
        f"  Milvus        : {info.milvus_uri}",
        f"  task queue    : {info.task_queue}",
        f"  data dir      : {info.data_dir}",
        f"  stack file    : {stack_file}",
    ]
    print("\n".join(lines), flush=True)


@asynccontextmanager
async def embedded_stack(
    settings: Settings, requested: DevPorts = DevPorts(), stop: asyncio.Event | None = None
) -> AsyncIterator[tuple[StackInfo, Settings, Client] | None]:
    """Start services and a worker; yield (addresses, settings pointed at them, client).

    Yields None when `stop` was set while the services were starting. Everything started is
    stopped on the way out: the worker first (running activities finish), then the services.
    """
    from mnemoflow.worker.app import running_worker  # imports the workflows; keep `--help` light

    stop = stop or asyncio.Event()
    data_dir = settings.mnemoflow.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    running = read_stack(data_dir)
    if running is not None:
        raise DevStackError(f"a dev stack (pid {running.pid}) already runs on {data_dir}")
    leftovers = leftover_services(data_dir)
    if leftovers:
        pids = " ".join(str(pid) for pid in leftovers.values())
        raise DevStackError(
            f"services of a dev stack that did not stop cleanly still run on {data_dir} "
            f"({leftovers}); stop them first: kill {pids}"
        )
    ports = choose_ports(requested)
    info = StackInfo(
        temporal_address=f"{LOOPBACK}:{ports.temporal}",
        namespace=settings.temporal.namespace,
        task_queue=settings.temporal.task_queue,
        ui_url=f"http://{LOOPBACK}:{ports.ui}" if ports.ui else None,
        redis_url=f"redis://{LOOPBACK}:{ports.redis}/0",
        milvus_uri=f"http://{LOOPBACK}:{ports.milvus}",
        data_dir=str(data_dir),
        pid=os.getpid(),
    )
    stack_settings = info.apply(settings)
    async with AsyncExitStack() as stack:
        stack.callback(remove_stack, data_dir)
        print(f"starting the embedded stack in {data_dir} ...", flush=True)
        codec_url = await _start_codec_server(stack_settings, ports, stack)
        procs = await _start_services(data_dir, ports, stack, codec_url)
        info = info.model_copy(update={"service_pids": {p.name: p.pid for p in procs}})
        # The gRPC port opens before the frontend serves the namespace: retry until a deadline.
        client = await connect_until(
            stack_settings.temporal,
            stop,
            retry_s=CONNECT_RETRY_S,
            deadline_s=CONNECT_DEADLINE_S,
            then=ensure_search_attributes,
            log_level=logging.DEBUG,
        )
        if client is None or stop.is_set():
            yield None
        else:
            await stack.enter_async_context(running_worker(client, stack_settings))
            yield info, stack_settings, client
        print("stopping the embedded stack ...", flush=True)


async def run_dev(settings: Settings, requested: DevPorts = DevPorts()) -> int:
    """Run the dev stack until SIGINT/SIGTERM; returns the process exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with embedded_stack(settings, requested, stop) as up:
        if up is not None:
            info, _, _ = up
            _print_addresses(info, write_stack(info))
            await stop.wait()
    print("dev stack stopped", flush=True)
    return 0


def main(settings: Settings, requested: DevPorts) -> int:
    """Entry point of `mnemoflow dev`."""
    try:
        return asyncio.run(run_dev(settings, requested))
    except (DevStackError, MissingBinaryError) as err:
        print(f"mnemoflow dev: {err}", file=sys.stderr)
        return 1
