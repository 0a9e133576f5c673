"""`mnemoflow worker`: connect to the configured services and poll until told to stop.

Order of events, as Kubernetes sees them:
1. the health endpoint starts first, so `/healthz` answers at once while `/readyz` says 503;
2. the worker connects to Temporal (retrying until it can or is told to stop), ensures the
   Milvus collection and starts polling; from then on `/readyz` checks Temporal, Milvus, Redis
   and the polling Workers on every probe. Which Workers poll is `worker.app.worker_plans`:
   with MNEMOFLOW_WORKER_ROLE the process runs only the workflow Worker or only the LLM one
   (two Deployments on Kubernetes, each scaled on its own queue's backlog);
3. SIGTERM (or Ctrl-C) makes `/readyz` fail at once, stops polling, lets running activities
   finish within MNEMOFLOW_GRACEFUL_SHUTDOWN_S, closes the store clients and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from contextlib import AsyncExitStack
from typing import Any

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from mnemoflow.worker.app import WorkerResources, running_worker
from mnemoflow.worker.client import connect_until
from mnemoflow.worker.health import Handler, HttpEndpoint, Readiness, probe_routes
from mnemoflow.worker.search_attributes import ensure_search_attributes
from mnemoflow.worker.settings import Settings
from mnemoflow.worker.web import free_port

log = logging.getLogger(__name__)

#: A user id no one has: readiness reads it (one Redis GET, one Milvus count) to prove the
#: stores answer, without touching real data.
PROBE_USER = "mnemoflow-readiness-probe"


class StartupError(Exception):
    """A setting the worker cannot start with that only shows when it is used (a port that
    is taken, a host that does not resolve); `mnemoflow worker` reports it as invalid
    configuration, in one line."""


async def _try_register_search_attributes(client: Client) -> None:
    # Registering needs operator rights that production identities (and Temporal Cloud) often
    # lack; there the attributes are provisioned out of band, so a refusal is only a warning.
    try:
        await ensure_search_attributes(client)
    except Exception as err:
        log.warning("could not register the mnemoflow search attributes: %s", err)


def add_readiness_checks(readiness: Readiness, client: Client, res: WorkerResources) -> None:
    """Temporal, Milvus and Redis answer, and every Worker of this process polls."""

    async def temporal() -> object:
        return await client.workflow_service.get_system_info(GetSystemInfoRequest())

    async def polling() -> bool:
        return all(w.is_running for w in res.workers)

    readiness.add("temporal", temporal)
    readiness.add("milvus", lambda: res.store.count(PROBE_USER))
    readiness.add("redis", lambda: res.read_model.get(PROBE_USER))
    readiness.add("polling", polling)


async def _endpoints(
    settings: Settings, readiness: Readiness, stack: AsyncExitStack
) -> tuple[Any, Any, dict[str, Any]]:
    """Start the health and metrics endpoints; returns (metrics, runtime, connect options)."""
    cfg = settings.mnemoflow
    routes: dict[int, dict[str, Handler]] = {}
    if cfg.health_port is not None:
        routes.setdefault(cfg.health_port, {}).update(probe_routes(readiness))
    metrics = runtime = None
    options: dict[str, Any] = {}
    if cfg.metrics_port is not None:
        from mnemoflow.worker.interceptors import MetricsInterceptor
        from mnemoflow.worker.metrics import CONTENT_TYPE, MnemoflowMetrics, render, sdk_runtime

        sdk_port = cfg.sdk_metrics_port or free_port()
        try:
            runtime = sdk_runtime(sdk_port)
        except Exception as err:  # the SDK's exporter binds here (a RuntimeError if taken)
            raise StartupError(f"MNEMOFLOW_SDK_METRICS_PORT={sdk_port}: {_one_line(err)}") from None
        metrics = MnemoflowMetrics()
        options = {"runtime": runtime, "interceptors": [MetricsInterceptor(metrics)]}
        sdk_url = f"http://127.0.0.1:{sdk_port}/metrics"

        async def scrape() -> tuple[int, str, bytes]:
            return 200, CONTENT_TYPE, await render(metrics, sdk_url)

        routes.setdefault(cfg.metrics_port, {})["/metrics"] = scrape
    for port, table in routes.items():
        names = [
            n for n, p in (("HEALTH", cfg.health_port), ("METRICS", cfg.metrics_port)) if p == port
        ]
        try:
            await stack.enter_async_context(HttpEndpoint(cfg.http_host, port, table))
        except OSError as err:
            setting = " and ".join(f"MNEMOFLOW_{n}_PORT" for n in names)
            raise StartupError(
                f"{setting}={port}: cannot listen on {cfg.http_host}:{port} "
                f"(MNEMOFLOW_HTTP_HOST): {err.strerror or err}"
            ) from None
    return metrics, runtime, options


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__


async def serve(settings: Settings) -> int:
    """Run the worker(s) until SIGINT/SIGTERM; returns the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    log.info("settings: %s", settings.redacted())
    readiness = Readiness()
    async with AsyncExitStack() as stack:
        _, _, options = await _endpoints(settings, readiness, stack)
        retry_s = settings.mnemoflow.connect_retry_s
        client = await connect_until(settings.temporal, stop, retry_s=retry_s, **options)
        if client is None:
            return 0
        await _try_register_search_attributes(client)
        async with running_worker(client, settings) as resources:
            add_readiness_checks(readiness, client, resources)
            queues = [w.task_queue for w in resources.workers]
            log.info("polling %s on %s", queues, settings.temporal.address)
            await stop.wait()
            readiness.drain()
            log.info("shutting down gracefully (running activities may finish)")
        log.info("worker stopped")
    return 0
