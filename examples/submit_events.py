"""Submit a short conversation for two users to a running `mnemoflow dev` stack.

    .venv/bin/mnemoflow dev &                 # in another terminal
    .venv/bin/python examples/submit_events.py

Messages are stamped two hours ago, so with the production gates every round is due at once;
the script waits until each user's memory has caught up (`MemoryClient.settle`) and prints
each user's workflow id and how to find it in the Temporal UI. The stack is found as the `mnemoflow`
commands find it (README, "Connecting to a running stack").
"""

from __future__ import annotations

import asyncio
import sys
import time

from mnemoflow import Settings, connect
from mnemoflow.middleware import MemoryNotSettledError
from mnemoflow.models.turns import ChatTurn
from mnemoflow.ops.target import NoTargetError, resolve_target
from mnemoflow.worker.memory_client import memory_client

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
    try:
        target = resolve_target(Settings.load())
    except NoTargetError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"using {target.description}", file=sys.stderr)
    settings = target.settings
    t0 = time.time() - 2 * 3600
    async with memory_client(await connect(settings.temporal), settings) as memory:
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
            await memory.submit(user, turns)
        for user in STORIES:
            try:
                status = await memory.settle(user, timeout_s=60)
            except MemoryNotSettledError as err:
                print(err, file=sys.stderr)
                return 1
            assert status is not None  # submitted above, so the workflow exists
            print(
                f"{user}: {status.rounds_completed} round(s), "
                f"{sum(r.fragments for r in status.rounds)} fragments; "
                f"workflow {memory.workflow_id(user)} (Temporal UI: MnemoflowUser = {user!r})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
