"""`mnemoflow inspect USER` and `mnemoflow forget USER`: what mnemoflow holds about a user.

Each takes settings already pointed at the services (`mnemoflow.ops.target`). Inspect reads the
user workflow (profile, rounds, costs), the read model and Milvus (fragments); forget runs the
user workflow's forget saga and prints its receipt.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from mnemoflow.middleware import MemoryClient
from mnemoflow.worker.client import connect
from mnemoflow.worker.memory_client import memory_client
from mnemoflow.worker.settings import Settings


async def _memory_client(settings: Settings) -> MemoryClient:
    return memory_client(await connect(settings.temporal), settings)


def _when(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else None


async def inspect_user(settings: Settings, user_id: str) -> dict[str, Any]:
    """Profile, fragments, rounds with their status, costs."""
    from mnemoflow.activities.fragment_store import FragmentStore
    from mnemoflow.worker.app import default_embeddings

    client = await _memory_client(settings)
    store = FragmentStore(
        uri=settings.milvus.uri,
        token=settings.milvus.token.get_secret_value() if settings.milvus.token else "",
        embeddings=default_embeddings(settings),
        collection=settings.milvus.collection,
    )
    try:
        status = await client.status(user_id)
        profile = await client.profile(user_id)
        fragments = await store.all_for_user(user_id)
    finally:
        await client.aclose()
        await store.close()
    return {
        "user_id": user_id,
        "workflow": "running" if status else "none",
        "profile": profile.model_dump(exclude_defaults=True) if profile else None,
        "fragments": [
            {
                "id": f.id,
                "theme": f.theme,
                "types": f.types,
                "content": f.content,
                "created_at": _when(f.created_at),
                "strengthen_count": f.strengthen_count,
                "thread": f.thread_id,
                "positions": [f.start_pos, f.end_pos],
                "explicit": f.explicit,
            }
            for f in fragments
        ],
        "rounds": [
            {
                "round": r.round_no,
                "status": r.status,
                "thread": r.thread_id,
                "positions": [r.start, r.end],
                "trigger": r.trigger,
                "fragments": r.fragments,
                "theme": r.theme,
                "error": r.error,
                "workflow_id": r.workflow_id,
            }
            for r in (status.rounds if status else [])
        ],
        "counters": (
            {
                "rounds_completed": status.rounds_completed,
                "rounds_failed": status.rounds_failed,
                "pending_turns": status.pending_turns,
                "inductions": status.inductions,
                "induction_cursor": status.induction_cursor,
                "last_error": status.last_error,
            }
            if status
            else {}
        ),
        "costs": status.ledger.model_dump() if status else None,
    }


def render(report: dict[str, Any]) -> str:
    """The inspect report for a person."""
    lines = [f"user {report['user_id']} (memory workflow: {report['workflow']})"]
    lines.append(f"profile: {json.dumps(report['profile'], ensure_ascii=False)}")
    lines.append(f"fragments ({len(report['fragments'])}):")
    for f in report["fragments"]:
        lines.append(f"  {f['id']} [{f['theme']} | {', '.join(f['types'])}] {f['content'][:100]}")
    lines.append(f"rounds ({len(report['rounds'])} recent):")
    for r in report["rounds"]:
        error = f" error: {r['error']}" if r["error"] else ""
        theme = f" ({r['theme']})" if r["theme"] else ""
        lines.append(
            f"  #{r['round']} {r['status']} {r['thread']} {r['positions']} "
            f"{r['trigger']} -> {r['fragments']} fragments{theme}{error}"
        )
    costs = report["costs"]
    if costs:
        lines.append(f"cost: {costs['cost']:.6f} {costs['currency']}")
        for op, usage in costs["by_operation"].items():
            lines.append(
                f"  {op}: {usage['calls']} calls, {usage['input_tokens']} in, "
                f"{usage['output_tokens']} out"
            )
        chat = costs.get("chat") or {}
        if chat.get("calls"):
            lines.append(
                f"main chat model (reported by the agent, unpriced): {chat['calls']} calls, "
                f"{chat['input_tokens']} in, {chat['output_tokens']} out"
            )
    return "\n".join(lines)


async def backfill_lines(settings: Settings) -> dict[str, Any]:
    """Write the line rows of every fragment that has none (activities/line_backfill.py), for
    fragments stored before the line collection, which the per-call search finds only through
    their lines; then drop the line collections older versions kept (once every fragment has
    its lines) and delete the fragment copies an older version kept in Redis."""
    import redis.asyncio as aioredis

    from mnemoflow.activities.fragment_store import FragmentStore
    from mnemoflow.activities.line_backfill import backfill_lines as backfill
    from mnemoflow.activities.search_corpus import drop_copies
    from mnemoflow.worker.app import default_embeddings

    store = FragmentStore(
        uri=settings.milvus.uri,
        token=settings.milvus.token.get_secret_value() if settings.milvus.token else "",
        embeddings=default_embeddings(settings),
        collection=settings.milvus.collection,
        flush_rows=settings.milvus.flush_rows,
        lines=True,
    )
    redis = aioredis.Redis.from_url(settings.redis.url)
    try:
        report = (await backfill(store)).as_dict()
        if not report["unsettled"]:
            report["line_collections_dropped"] = await store.drop_earlier_lines()
        report["redis_copies_deleted"] = await drop_copies(redis, settings.redis.key_prefix)
    finally:
        await store.close()
        await redis.aclose()
    return report


async def forget_user(settings: Settings, user_id: str, reason: str) -> dict[str, Any]:
    """Run the forget saga; the receipt says what was deleted and when."""
    client = await _memory_client(settings)
    try:
        receipt = await client.forget(user_id, reason)
    finally:
        await client.aclose()
    return receipt.model_dump()


async def rounds_report(settings: Settings, user_id: str, failed_only: bool) -> dict[str, Any]:
    """`mnemoflow rounds`: the user's rounds from visibility, with event ids to retry."""
    from mnemoflow.ops.operations import list_rounds

    temporal = await connect(settings.temporal)
    client = memory_client(temporal, settings)
    try:
        return await list_rounds(temporal, client, user_id, failed_only)
    finally:
        await client.aclose()


async def retry(settings: Settings, user_id: str, event_id: str) -> dict[str, Any]:
    """`mnemoflow retry`: re-run a failed round through the user workflow's update."""
    client = await _memory_client(settings)
    try:
        return (await client.retry_round(user_id, event_id)).model_dump()
    finally:
        await client.aclose()
