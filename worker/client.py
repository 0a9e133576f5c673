"""The one place that connects a Temporal client.

Everything that talks to Temporal (worker, dev stack, CLI commands, tests of the process) goes
through `connect`, so the data converter is the same everywhere: pydantic, as docs/ARCHITECTURE.md
requires, because every contract is a pydantic model.
With encryption keys configured it also carries the AES-GCM payload codec (`worker.codec`),
so no client or worker can send conversation text to Temporal in the clear.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client, Interceptor, TLSConfig
from temporalio.runtime import Runtime

from mnemoflow.worker.codec import data_converter
from mnemoflow.worker.settings import TemporalSettings

log = logging.getLogger(__name__)


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def tls_config(settings: TemporalSettings) -> TLSConfig | bool:
    """The TLS argument of `Client.connect` for these settings (False = plaintext)."""
    if not settings.uses_tls:
        return False
    return TLSConfig(
        server_root_ca_cert=_read(settings.tls_server_ca_cert_path),
        domain=settings.tls_server_name,
        client_cert=_read(settings.tls_client_cert_path),
        client_private_key=_read(settings.tls_client_key_path),
    )


async def connect(
    settings: TemporalSettings,
    *,
    runtime: Runtime | None = None,
    interceptors: Sequence[Interceptor] = (),
) -> Client:
    """Connect to Temporal with the pydantic data converter, TLS and API key as configured.

    `runtime` (one per process, e.g. with a metrics exporter) and `interceptors` (those that are
    also worker interceptors apply to every Worker on this client) are for `mnemoflow worker`.
    """
    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    return await Client.connect(
        settings.address,
        namespace=settings.namespace,
        api_key=api_key,
        tls=tls_config(settings),
        data_converter=data_converter(settings.encryption),
        runtime=runtime,
        interceptors=list(interceptors),
    )


async def connect_until(
    settings: TemporalSettings,
    stop: asyncio.Event,
    *,
    retry_s: float,
    deadline_s: float | None = None,
    then: Callable[[Client], Awaitable[object]] | None = None,
    log_level: int = logging.WARNING,
    **options: Any,
) -> Client | None:
    """Connect (and run `then` on the client) until it works; None if `stop` is set first.

    A worker pod may start before Temporal, and the dev server opens its port before its
    frontend serves the namespace, so both the worker and the dev stack retry here. With
    `deadline_s` the last error is raised once it passes; without, this retries until stopped.
    The pause between attempts is cut short by `stop`.
    """
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    while not stop.is_set():
        try:
            client = await connect(settings, **options)
            if then is not None:
                await then(client)
            return client
        except Exception as err:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            log.log(log_level, "cannot reach Temporal at %s yet: %s", settings.address, err)
        try:
            await asyncio.wait_for(stop.wait(), retry_s)
        except TimeoutError:
            pass
    return None
