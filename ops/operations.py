"""Operators' commands: a user's rounds from Temporal visibility, retrying a failed one.

The same queries work in the Temporal UI's search box, so what `mnemoflow rounds` prints is
what an operator would type there (docs/OPERATIONS.md).
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from mnemoflow.middleware import MemoryClient
from mnemoflow.models import search_attributes as sa


def quoted(value: str) -> str:
    """A visibility-query string literal (backslashes and double quotes escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rounds_query(search_user: str, failed_only: bool = False) -> str:
    """The visibility query for a user's rounds (optionally only the failed ones)."""
    query = f"{sa.USER.name} = {quoted(search_user)} AND WorkflowType = 'MemoryRoundWorkflow'"
    if failed_only:
        query += f" AND {sa.OUTCOME.name} = 'failed'"
    return query


def _outcome_of(status: WorkflowExecutionStatus | None) -> str | None:
    """The outcome a round's execution status stands for, where the round wrote none."""
    if status is None:
        return None
    return _OUTCOMES.get(status, status.name.lower())


_OUTCOMES = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
}


async def list_rounds(
    temporal: Client, client: MemoryClient, user_id: str, failed_only: bool = False
) -> dict[str, Any]:
    """A user's rounds as visibility sees them, joined with the user workflow's records."""
    query = rounds_query(client.search_user(user_id), failed_only)
    status = await client.status(user_id)
    records = {r.workflow_id: r for r in (status.rounds if status else [])}
    rows = []
    async for execution in temporal.list_workflows(query):
        attrs = execution.typed_search_attributes
        record = records.get(execution.id)
        rows.append(
            {
                "workflow_id": execution.id,
                "round": attrs.get(sa.ROUND),
                "status": execution.status.name if execution.status else None,
                # A round that completed writes no outcome or theme (round shape 7): its
                # status says it, and the user workflow's record keeps the theme.
                "outcome": attrs.get(sa.OUTCOME) or _outcome_of(execution.status),
                "trigger": attrs.get(sa.TRIGGER),
                "theme": attrs.get(sa.THEME) or (record.theme if record else None),
                "event_id": record.event_id if record else None,
                "error": record.error if record else None,
            }
        )
    rows.sort(key=lambda r: r["round"] or 0)
    return {"user": user_id, "query": query, "rounds": rows}


def render_rounds(report: dict[str, Any]) -> str:
    """The rounds report for a person."""
    lines = [f"query: {report['query']}"]
    for r in report["rounds"]:
        error = f"  error: {r['error']}" if r["error"] else ""
        lines.append(
            f"#{r['round']} {r['status']} outcome={r['outcome']} trigger={r['trigger']} "
            f"theme={r['theme']} event={r['event_id']}{error}"
        )
    if not report["rounds"]:
        lines.append("(no rounds)")
    return "\n".join(lines)
