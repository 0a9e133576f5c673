"""The forget_memory tool with the worker killed mid-forget: the turn goes on, and the tool
says what is true (accepted and under way), not that memory is unavailable or that it is done.

Two real worker processes serve one task queue with the production bounds. The user has two
remembered facts; a conversation quoting one of them ("please remember this: ...") is in a
round on the first worker, whose memory model takes two minutes a call (its local slice attempt
is under way). The agent's turn calls forget_memory for that fact: the user workflow accepts
the forget on the first worker and deletes the row, then waits for the running round (it holds
the quoting line, docs/ARCHITECTURE.md, "Invariants"). The first worker is SIGKILLed then. The
forget can only finish once the second worker has taken over the round (its workflow-task
timeout) and the user workflow (its sticky queue's timeout, 5 s): past the tool's time. The
tool must say the forget is accepted and under way; the forget must then complete on its own,
and every other line said must be stored once, the forgotten words nowhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.middleware import MemoryClient, memory_tools
from mnemoflow.middleware.tools import FORGET_PENDING
from mnemoflow.models.contracts import ForgetFragmentResult, UserStatus
from mnemoflow.models.errors import MemoryUnavailableError
from tests.middleware.test_agent_integration import CFG, ScriptedModel, harness
from tests.support.drive import conversation, eventually
from tests.support.invariants import said_vs_stored
from tests.support.reliability import Ledger
from tests.support.worker_process import worker_process

pytestmark = pytest.mark.integration

#: The tool's time in this test (production: 10 s). Whatever its length, the forget cannot
#: finish sooner than 10 s after the kill: the delete in flight is retried once its heartbeat
#: timed out (STORE_HEARTBEAT), and the user workflow's next task goes to the dead worker's
#: sticky queue first (the SDK's 10 s). 5 s keeps "pending" certain and the test short.
TOOL_TIMEOUT_S = 5.0


async def test_forget_tool_with_the_worker_killed_mid_forget_reports_it_pending(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    temporal = dev_env.client
    tag = uuid.uuid4().hex[:10]
    task_queue, collection, prefix = f"tq-ftk-{tag}", f"t_ftk_{tag}", f"test:{tag}:"
    common = dict(
        address=temporal.service_client.config.target_host, task_queue=task_queue,
        milvus=milvus_uri, redis=redis_url, collection=collection, prefix=prefix,
    )  # fmt: skip
    store = FragmentStore(uri=milvus_uri, embeddings=HashingEmbeddings(), collection=collection)
    client = MemoryClient(
        temporal=temporal, task_queue=task_queue, redis=redis_url, key_prefix=prefix,
        config=CFG, tool_timeout_s=TOOL_TIMEOUT_S,
    )  # fmt: skip
    user = f"ftk-{tag}"
    secret = f"My locker code at the gym is 4471-{tag[:4]}."
    kept = f"My favourite tea is smoked lapsang, batch {tag[4:8]}."
    said = [
        f"Please remember this: {secret}",
        f"Noted, I will keep that in mind [{tag}].",
        f"I also climb on Thursdays at the Nordwand hall [{tag}].",
        f"Thursdays at Nordwand, got it [{tag}].",
        f"And I'm training for a 6a+ route called Kestrel [{tag}].",
        f"Good luck with Kestrel [{tag}].",
    ]
    marks = tmp_path / "first.marks"
    try:
        with worker_process(
            tmp_path, "first", slow_llm_s=120.0, llm_marks=marks, **common
        ) as first:  # type: ignore[arg-type]
            kept_id = (await client.remember(user, kept)).fragment_id
            secret_id = (await client.remember(user, secret)).fragment_id
            await client.submit(
                user, conversation("t", said, time.time() - 300, step=5.0), urgent=True
            )

            async def slicing_locally() -> bool:
                return marks.exists() and "slice local" in marks.read_text()

            await eventually(slicing_locally, deadline_s=30, what="the round's local slice")
            with worker_process(tmp_path, "second", **common) as second:  # type: ignore[arg-type]
                call = tool_call_with_id("forget_memory", {"fragment_id": secret_id})
                model = ScriptedModel(script=[call, AIMessage("I have asked memory to forget it.")])
                h = harness(client, tools=memory_tools(client), model=model)
                turn = asyncio.create_task(h.turn(user, "t-forget", "Forget my locker code."))

                async def deleted() -> bool:  # the forget was accepted and is under way
                    return secret_id not in {f.id for f in await store.all_for_user(user)}

                await eventually(deleted, deadline_s=TOOL_TIMEOUT_S, what="the row deleted")
                assert not turn.done(), "the forget finished before the kill: nothing tested"
                os.kill(first.pid, signal.SIGKILL)
                killed_at = time.monotonic()
                first.wait(timeout=10)
                out = await asyncio.wait_for(turn, timeout=TOOL_TIMEOUT_S + 30)
                tool_said = [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]
                print(f"tool said: {tool_said}")
                assert tool_said == [FORGET_PENDING.format(id=secret_id)], tool_said
                # The turn went on: the model answered after the tool.
                assert isinstance(out["messages"][-1], AIMessage)
                assert out["messages"][-1].content == "I have asked memory to forget it."
                # The forget completes on the second worker, under the id the tool gave it.
                update_id = tool_update_id(call, secret_id)
                pending = ForgetFragmentResult(deleted=0, pending=True, update_id=update_id)
                result = await client.forget_fragment_result(user, pending, timeout_s=60)
                finished_after = time.monotonic() - killed_at
                assert result.deleted == 1 and not result.pending, result
                box: dict[str, UserStatus] = {}

                async def indexed() -> bool:
                    try:
                        s = await client.status(user, timeout_s=5)
                    except (MemoryUnavailableError, RPCError):
                        return False
                    if s is None or "t" not in s.watermarks:
                        return False
                    box["s"] = s
                    return s.watermarks["t"].indexed == s.watermarks["t"].accepted == len(said)

                await eventually(indexed, deadline_s=60, what="the conversation indexed")
                status = box["s"]
                rows = await store.all_for_user(user)
                # What was said and not forgotten: stored once each (the other lines of the
                # conversation, the kept fact); the forgotten words in no row (the quoting
                # line keeps only "Please remember this:").
                report = await said_vs_stored(
                    store, user, status, {"t": [*said[1:], kept]}, forgotten=[secret]
                )
                leaked = [r.content for r in rows if secret in r.content]
                print(
                    f"forget finished {finished_after:.1f} s after the kill; {len(rows)} rows; "
                    f"{report}; rows with the forgotten words: {len(leaked)}"
                )
                assert (report.lost, report.duplicated) == (0, 0), report
                assert not leaked, leaked
                assert kept_id in {r.id for r in rows}
                assert status.rounds_failed == 0
                assert second.poll() is None
                await client.aclose()
    finally:
        await store.drop()
        await store.close()
    reliability.record(
        request,
        key="forget-tool-worker-killed",
        kind="fault",
        what="The agent's forget_memory tool while the worker running the forget is killed with "
        "SIGKILL (the forget accepted, its row deleted, waiting for the round that holds a "
        f"quoting line); a second worker process; tool time {TOOL_TIMEOUT_S:.0f} s",
        happened="the turn went on; the tool said the forget was accepted and under way (not "
        f"unavailable, not done); it completed {finished_after:.1f} s after the kill on the "
        f"second worker (1 row deleted); the forgotten words in {len(leaked)} rows; "
        f"{len(said) - 1} other lines and 1 remembered fact stored once",
        outcome=report,
        started=started,
    )


def tool_call_with_id(name: str, args: dict[str, object]) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[{"name": name, "args": args, "id": uuid.uuid4().hex[:8], "type": "tool_call"}],
    )


def tool_update_id(call: AIMessage, fragment_id: str) -> str:
    """The update id forget_memory gives a forget (middleware/tools.py): by its tool call id."""
    digest = hashlib.sha256(fragment_id.encode("utf-8")).hexdigest()[:12]
    return f"forget-{call.tool_calls[0]['id']}-{digest}"
