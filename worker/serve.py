"""`mnemoflow worker`: connect to the configured services and poll until told to stop.

SIGTERM (Kubernetes) and Ctrl-C both start a graceful shutdown: the worker stops polling, lets
running activities finish within `app.GRACEFUL_SHUTDOWN`, then the store clients close.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from temporalio.client import Client

from worker.app import running_worker
from worker.client import connect
from worker.search_attributes import ensure_search_attributes
from worker.settings import Settings

log = logging.getLogger(__name__)


async def _try_register_search_attributes(client: Client) -> None:
    # Registering needs operator rights that production identities (and Temporal Cloud) often
    # lack; there the attributes are provisioned out of band, so a refusal is only a warning.
    try:
        await ensure_search_attributes(client)
    except Exception as err:
        log.warning("could not register the mnemoflow search attributes: %s", err)


async def serve(settings: Settings) -> int:
    """Run the worker(s) until SIGINT/SIGTERM; returns the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    log.info("settings: %s", settings.redacted())
    client = await connect(settings.temporal)
    await _try_register_search_attributes(client)
    async with running_worker(client, settings) as resources:
        queues = [w.task_queue for w in resources.workers]
        log.info("polling %s on %s", queues, settings.temporal.address)
        await stop.wait()
        log.info("shutting down gracefully")
    return 0
