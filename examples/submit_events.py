"""Submit a short conversation for two users to a running `mnemoflow dev` stack.

    .venv/bin/mnemoflow dev &                 # in another terminal
    .venv/bin/python examples/submit_events.py

Messages are stamped two hours ago, so with the production gates every round is due at once;
the script waits for the rounds and prints where each user's workflow is in the Temporal UI.
"""

from __future__ import annotations

import asyncio
import sys
import time
from urllib.parse import quote

from mnemoflow.devstack.stack import read_stack
from mnemoflow.middleware import MemoryClient
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.models.turns import ChatTurn
from mnemoflow.worker.client import connect
from mnemoflow.worker.settings import Settings

STORIES = {
    "alice": [
        "Hi, I'm Alice, a pharmacist.",
        "Welcome!",
        "My order 1207 arrived broken.",
        "Sorry!",
    ],
    "bob": [
        "Bob here; I only shop on weekends.",
        "Noted.",
        "Send invoices to bob@example.com.",
        "OK",
    ],
}


async def main() -> int:
    settings = Settings.load()
    stack = read_stack(settings.mnemoflow.data_dir)
    if stack is None:
        print("no running dev stack: start `mnemoflow dev` first", file=sys.stderr)
        return 1
    settings = stack.apply(settings)
    client = MemoryClient(
        temporal=await connect(settings.temporal),
        task_queue=settings.temporal.task_queue,
        redis=settings.redis.url,
        key_prefix=settings.redis.key_prefix,
    )
    t0 = time.time() - 2 * 3600
    for user, lines in STORIES.items():
        turns = [
            ChatTurn(
                thread_id="example",
                position=i,
                role="human" if i % 2 == 0 else "ai",
                content=text,
                time=t0 + 35 * i,
            )
            for i, text in enumerate(lines)
        ]
        await client.submit(user, turns)
    deadline = time.monotonic() + 60
    for user in STORIES:
        while True:
            status = await client.status(user)
            if status and status.rounds_completed >= 1:
                break
            if time.monotonic() > deadline:
                print(f"{user}: no round completed within 60 s", file=sys.stderr)
                return 1
            await asyncio.sleep(0.2)
        wid = quote(user_workflow_id(user), safe="")
        print(
            f"{user}: {status.rounds_completed} round(s), "
            f"{sum(r.fragments for r in status.rounds)} fragments; "
            f"{stack.ui_url}/namespaces/{stack.namespace}/workflows/{wid}"
        )
    await client.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
