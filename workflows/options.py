"""Activity options and small deterministic helpers shared by the two workflows (sandbox-safe).

Every activity call of the workflows takes its timeouts and retry policy from `llm_activity` or
`store_activity`, so the two classes of call (an LLM provider, a store) are configured here once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.workflow import ActivityCancellationType

from mnemoflow.models import search_attributes as sa
from mnemoflow.models.errors import NON_RETRYABLE_TYPES


def _backoff(first: timedelta, longest: timedelta) -> RetryPolicy:
    """Doubling intervals; invalid input (NON_RETRYABLE_TYPES) is never retried."""
    return RetryPolicy(
        initial_interval=first,
        backoff_coefficient=2.0,
        maximum_interval=longest,
        non_retryable_error_types=list(NON_RETRYABLE_TYPES),
    )


# LLM calls: a provider outage of hours is absorbed here, then the round fails visibly.
LLM_START_TO_CLOSE = timedelta(minutes=2)
LLM_SCHEDULE_TO_CLOSE = timedelta(hours=6)
LLM_RETRY = _backoff(timedelta(seconds=2), timedelta(minutes=5))
# LLM activities heartbeat while the call runs: a worker killed mid-call is noticed after this
# long and the call is retried elsewhere, not after LLM_START_TO_CLOSE (a stall of minutes).
LLM_HEARTBEAT = timedelta(seconds=10)
# Store calls (Milvus, Redis): short attempts, retried for an hour of store downtime.
STORE_START_TO_CLOSE = timedelta(seconds=60)
STORE_SCHEDULE_TO_CLOSE = timedelta(hours=1)
STORE_RETRY = _backoff(timedelta(seconds=1), timedelta(seconds=60))
# The index activity heartbeats while it embeds and upserts: a worker killed mid-index is
# noticed after this long (not after STORE_START_TO_CLOSE) and another worker retries it.
STORE_HEARTBEAT = timedelta(seconds=10)
# The lean round's store step runs as a local activity for this long at most (a local activity
# is invisible to operators while it retries); then as an ordinary activity with the bounds above.
LOCAL_STORE_BOUND = timedelta(seconds=10)
# One local attempt with the whole bound. With three attempts of a third each, a busy worker's
# store steps ran past their third (they wait for the worker's threads and the store behind the
# other rounds' steps), were cancelled and made again while the cancelled attempt's Milvus calls
# went on in their threads: 4-200 rounds in 1,200 did the step twice in a throughput run
# (`local_activity_retries` in benchmarks/results/throughput.json). Three attempts of the whole
# bound each would not do: the SDK makes the attempts a retry policy allows before it honours
# schedule_to_close (measured with a hung local activity, bound 2 s: one attempt gave up after
# 2.0 s, three of a third after 2.2 s, three of the whole bound after 8.0 s). A step that fails
# at once goes to the ordinary activity at once, which retries it visibly.
LOCAL_STORE_RETRY = RetryPolicy(
    maximum_attempts=1, non_retryable_error_types=list(NON_RETRYABLE_TYPES)
)
# Shape 3 runs the LLM steps (slice, tune) as one local attempt on the round's worker first,
# when the LLM activities share the workflow's task queue: a success leaves one marker instead of
# an activity's three events and a workflow task. An attempt that fails or runs past this bound
# hands the call to the ordinary activity (LLM queue, retries for hours, heartbeats, attempts
# visible in the UI). The bound is well under LLM_START_TO_CLOSE: a slow provider is paid for
# twice at most once per call, and an outage is in the UI within seconds.
LOCAL_LLM_BOUND = timedelta(seconds=30)
LOCAL_LLM_RETRY = RetryPolicy(
    maximum_attempts=1, non_retryable_error_types=list(NON_RETRYABLE_TYPES)
)
# A round's workflow task stays open while its local attempts run (the LLM step, then the store
# step). A local activity has no heartbeat: when the worker holding that task dies, Temporal
# hands the task to another worker only once this timeout has passed, which then makes the
# local attempt again (nothing of it was recorded). So this is what a SIGKILL during a local
# attempt stalls a round: at 55 s (both local bounds with a quarter to spare) a round settled
# 52-55 s after the kill; at Temporal's default of 10 s, 4-10 s
# (tests/workflows/test_kill_local_slice.py). What it costs: past 80 % of the timeout the SDK
# completes the task and opens a new one to keep it alive, three more history events and one
# more task each 8 s a local attempt runs (measured: 24.8 events and 4.8 tasks a round at 5 s
# per LLM call, against 20.4 and 3.6 with the task open for 55 s; docs/PERFORMANCE.md). A few
# events on slow calls are cheaper than a round stalled for most of a minute; the local LLM
# bound stays 30 s, so a slow call is not paid for twice (an attempt cut short is made again).
ROUND_TASK_TIMEOUT = timedelta(seconds=10)
# A publish is one small Redis write: an attempt that takes longer is stuck.
PUBLISH_START_TO_CLOSE = timedelta(seconds=15)


def llm_activity(summary: str, task_queue: str | None) -> dict[str, Any]:
    """Options of an activity that calls the memory LLM (on its own task queue when split)."""
    return {
        "task_queue": task_queue,
        "start_to_close_timeout": LLM_START_TO_CLOSE,
        "schedule_to_close_timeout": LLM_SCHEDULE_TO_CLOSE,
        "heartbeat_timeout": LLM_HEARTBEAT,
        "retry_policy": LLM_RETRY,
        "summary": summary,
    }


def store_activity(
    summary: str,
    *,
    start_to_close: timedelta = STORE_START_TO_CLOSE,
    schedule_to_close: timedelta = STORE_SCHEDULE_TO_CLOSE,
    heartbeat: timedelta | None = None,
) -> dict[str, Any]:
    """Options of an activity that reads or writes Milvus or Redis. A cancelled one is waited
    for (WAIT_CANCELLATION_COMPLETED): a forget cancels the running round and deletes only
    after its writes ended, so an index attempt still in flight cannot bring a row back."""
    return {
        "cancellation_type": ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        "start_to_close_timeout": start_to_close,
        "schedule_to_close_timeout": schedule_to_close,
        "heartbeat_timeout": heartbeat,
        "retry_policy": STORE_RETRY,
        "summary": summary,
    }


def store_local_activity(summary: str) -> dict[str, Any]:
    """Options of the lean round's store step as a local activity: one attempt within
    LOCAL_STORE_BOUND (LOCAL_STORE_RETRY says why), after which the round runs it as an ordinary
    activity (`store_activity`). Cancelled, it is waited for, like `store_activity`."""
    return {
        "cancellation_type": ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        "start_to_close_timeout": LOCAL_STORE_BOUND,
        "schedule_to_close_timeout": LOCAL_STORE_BOUND,
        "retry_policy": LOCAL_STORE_RETRY,
        "summary": summary,
    }


def llm_local_activity(summary: str) -> dict[str, Any]:
    """Options of an LLM step's one local attempt (shape 3): one try within LOCAL_LLM_BOUND,
    after which the round runs it as an ordinary activity (`llm_activity`). An LLM call writes
    nothing, so a cancelled attempt is not waited for."""
    return {
        "start_to_close_timeout": LOCAL_LLM_BOUND,
        "schedule_to_close_timeout": LOCAL_LLM_BOUND,
        "retry_policy": LOCAL_LLM_RETRY,
        "summary": summary,
    }


def local_tune_budget_s() -> float:
    """How long the local slice-and-tune step may spend before it stops tuning: two thirds of
    LOCAL_LLM_BOUND, so it returns with its slice before the bound (a slice that succeeded is
    never lost and made again); what it did not tune, the round tunes as activities."""
    return LOCAL_LLM_BOUND.total_seconds() * 2 / 3


def activity_tune_budget_s() -> float:
    """The same for shape 6's slice-and-tune activity on an LLM queue of its own: two thirds
    of LLM_START_TO_CLOSE, so the attempt returns its slice before it would time out."""
    return LLM_START_TO_CLOSE.total_seconds() * 2 / 3


def round_search_attributes(
    *,
    user: str | None = None,
    round_no: int | None = None,
    trigger: str | None = None,
    theme: str | None = None,
    outcome: str | None = None,
) -> TypedSearchAttributes:
    """The search attributes of a round; only the given ones (children do not inherit them)."""
    pairs: list[SearchAttributePair] = []
    if user is not None:
        pairs.append(SearchAttributePair(sa.USER, user))
    if round_no is not None:
        pairs.append(SearchAttributePair(sa.ROUND, round_no))
    if trigger is not None:
        pairs.append(SearchAttributePair(sa.TRIGGER, trigger))
    if theme is not None:
        pairs.append(SearchAttributePair(sa.THEME, sa.theme_value(theme)))
    if outcome is not None:
        pairs.append(SearchAttributePair(sa.OUTCOME, outcome))
    return TypedSearchAttributes(pairs)


def upsert_round_attributes(*, theme: str | None = None, outcome: str | None = None) -> None:
    """Record a round's theme or outcome as it becomes known (visible in the Temporal UI)."""
    updates: list = []
    if theme is not None:
        updates.append(sa.THEME.value_set(sa.theme_value(theme)))
    if outcome is not None:
        updates.append(sa.OUTCOME.value_set(outcome))
    if updates:
        workflow.upsert_search_attributes(updates)


def failure_text(err: BaseException) -> str:
    """The innermost failure message, which is what an operator needs to read."""
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {err}"[:1000]
