"""Interceptors that record `mnemoflow.worker.metrics` without touching workflow or activity code.

Passed to `worker.client.connect` (a client interceptor that is also a worker interceptor is
used by every Worker built on that client), so `mnemoflow.worker.app` stays unchanged:

- activities: latency and outcome of every attempt, and what completed ones produced
  (fragments indexed, injected context size, LLM tokens and cost, select latency);
- rounds: the outcome of each `MemoryRoundWorkflow` run. The workflow itself knows it best
  (it also sets the `MnemoflowOutcome` search attribute); counting at the end of `run`, outside
  replay, counts each round once per execution on whichever worker finishes it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from temporalio import activity, client, workflow
from temporalio.exceptions import FailureError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from mnemoflow.worker.metrics import MnemoflowMetrics

ROUND_WORKFLOW = "MemoryRoundWorkflow"


class _ActivityMetrics(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, metrics: MnemoflowMetrics) -> None:
        super().__init__(next)
        self._metrics = metrics

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        name = activity.info().activity_type
        started = time.perf_counter()
        outcome = "failed"
        try:
            result = await super().execute_activity(input)
            outcome = "completed"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as err:
            self._metrics.activity_failed(name, err)
            raise
        finally:
            self._metrics.activity_ended(name, outcome, time.perf_counter() - started)
        self._metrics.activity_result(name, result)
        return result


def _round_interceptor(metrics: MnemoflowMetrics) -> type[WorkflowInboundInterceptor]:
    class _RoundMetrics(WorkflowInboundInterceptor):
        async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
            if workflow.info().workflow_type != ROUND_WORKFLOW:
                return await super().execute_workflow(input)
            try:
                result = await super().execute_workflow(input)
            except asyncio.CancelledError:
                _record("cancelled")
                raise
            except FailureError:
                _record("failed")
                raise
            # Any other exception fails the workflow *task* (retried), not the round: not counted.
            _record("completed")
            return result

    def _record(outcome: str) -> None:
        # A side effect in workflow code: skipped while replaying, so a worker that rebuilds a
        # finished round from history does not count it again.
        if not workflow.unsafe.is_replaying():
            with workflow.unsafe.sandbox_unrestricted():
                metrics.round_ended(outcome)

    return _RoundMetrics


class MetricsInterceptor(client.Interceptor, Interceptor):
    """Records mnemoflow's metrics for every Worker of the client it is connected with."""

    def __init__(self, metrics: MnemoflowMetrics) -> None:
        self.metrics = metrics
        self._workflow_class = _round_interceptor(metrics)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityMetrics(next, self.metrics)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return self._workflow_class
