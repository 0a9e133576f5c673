"""The one worker wiring: which Workers a role runs, and Worker Versioning on the dev server."""

from __future__ import annotations

import time
import uuid

import pytest
from pydantic import ValidationError
from temporalio.api.enums.v1 import VersioningBehavior as ApiVersioningBehavior
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.worker.app import Components, WorkerPlan, deployment_config, running_worker
from mnemoflow.worker.app import worker_plans as plans_of
from mnemoflow.worker.settings import MnemoflowSettings, Settings, TemporalSettings
from tests.support.drive import conversation, eventually, submit, wait_status
from tests.support.memory_worker import fresh_settings, terminate_started, worker_settings


def settings(llm_queue: str | None = None, **mnemoflow: object) -> Settings:
    base = worker_settings(
        task_queue="main",
        milvus_uri="http://127.0.0.1:1",
        collection="c",
        redis_url="redis://127.0.0.1:1/0",
        key_prefix="p:",
    )
    return base.model_copy(
        update={
            "temporal": TemporalSettings(task_queue="main", llm_task_queue=llm_queue),
            "mnemoflow": base.mnemoflow.model_copy(update=mnemoflow),
        }
    )


def test_one_queue_runs_everything_on_one_worker() -> None:
    for llm in (None, "main"):
        assert plans_of(settings(llm)) == [WorkerPlan("main", True, True, True)]


def test_split_queues_one_worker_per_queue_by_role() -> None:
    workflow = WorkerPlan("main", True, True, False)
    llm = WorkerPlan("llm", False, False, True, activities_per_second=2.5)
    split = {"llm_activities_per_second": 2.5}
    assert plans_of(settings("llm", worker_role="all", **split)) == [workflow, llm]
    assert plans_of(settings("llm", worker_role="workflow", **split)) == [workflow]
    assert plans_of(settings("llm", worker_role="llm", **split)) == [llm]


def test_a_split_role_without_a_split_queue_is_refused() -> None:
    with pytest.raises(ValueError, match="needs TEMPORAL_LLM_TASK_QUEUE"):
        plans_of(settings(None, worker_role="llm"))


def test_versioning_is_off_unless_named_and_needs_a_build_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert deployment_config(settings()) is None
    monkeypatch.setenv("MNEMOFLOW_DEPLOYMENT_NAME", "mnemoflow")
    with pytest.raises(ValidationError, match="MNEMOFLOW_BUILD_ID"):
        MnemoflowSettings()
    monkeypatch.setenv("MNEMOFLOW_BUILD_ID", "1.4.2")
    config = deployment_config(settings(**MnemoflowSettings().model_dump()))
    assert config is not None and config.use_worker_versioning
    assert (config.version.deployment_name, config.version.build_id) == ("mnemoflow", "1.4.2")
    assert config.default_versioning_behavior == VersioningBehavior.AUTO_UPGRADE


async def _versions(client: Client, deployment: str) -> list[str]:
    try:
        desc = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
        )
    except Exception:
        return []  # not created until the first poll reaches the server
    summaries = desc.worker_deployment_info.version_summaries
    return [s.deployment_version.build_id for s in summaries]


@pytest.mark.integration
async def test_a_versioned_worker_registers_its_version_and_runs_rounds_once_current(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    client = dev_env.client
    tag = uuid.uuid4().hex[:8]
    deployment, build = f"mnemoflow-{tag}", f"build-{tag}"
    run = fresh_settings(milvus_uri, redis_url, deployment_name=deployment, build_id=build)
    components = Components(models=HeuristicMemoryModels())
    async with running_worker(client, run, components):

        async def registered() -> bool:
            return build in await _versions(client, deployment)

        await eventually(registered, deadline_s=30, what="the version to be registered")
        await client.workflow_service.set_worker_deployment_current_version(
            SetWorkerDeploymentCurrentVersionRequest(
                namespace=client.namespace,
                deployment_name=deployment,
                build_id=build,
                identity="test",
            )
        )
        user = f"versioned-{tag}"
        lines = ["My order 881 is late.", "Looking into order 881."]
        turns = conversation("t", lines, time.time() - 3 * 3600)
        handle = await submit(client, run.temporal.task_queue, user, turns, urgent=True)
        await wait_status(handle, lambda s: s.rounds_completed == 1, deadline_s=90, what="round")
        desc = await handle.describe()
        versioning = desc.raw_description.workflow_execution_info.versioning_info
        assert versioning.deployment_version.build_id == build, versioning
        assert versioning.behavior == ApiVersioningBehavior.VERSIONING_BEHAVIOR_AUTO_UPGRADE
        await terminate_started(client, run.temporal.task_queue)
