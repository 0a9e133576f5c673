"""Which services an operator command talks to: never a silent default.

In order:
1. `--data-dir DIR`: the `mnemoflow dev` stack running there (its `stack.json`); an error if
   none runs there.
2. `TEMPORAL_ADDRESS` set in the environment: the configured services (a cluster; Milvus and
   Redis from `MILVUS_URI` and `REDIS_URL`).
3. A dev stack running in `MNEMOFLOW_DATA_DIR` (default `.run`).
4. Otherwise an error that says how to point the command somewhere.

The chosen target is described in one line, which the CLI prints to stderr, so stdout stays
machine-readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mnemoflow.devstack.stack import read_stack, stack_path
from mnemoflow.worker.settings import Settings


class NoTargetError(Exception):
    """Nothing to talk to: no running dev stack where asked, and no configured address."""


@dataclass(frozen=True)
class Target:
    """Settings pointed at the services, and a line that says which ones."""

    settings: Settings
    description: str


def resolve_target(settings: Settings, data_dir: str | Path | None = None) -> Target:
    """The services a command should use (see the module docstring for the order)."""
    if data_dir is not None:
        running = read_stack(data_dir)
        if running is None:
            raise NoTargetError(
                f"no running mnemoflow dev stack in {data_dir} ({stack_path(data_dir)} is "
                f"missing or its process is gone); start one with "
                f"`mnemoflow dev --data-dir {data_dir}`"
            )
        return Target(running.apply(settings), _stack_line(data_dir, running.temporal_address))
    temporal = settings.temporal
    if "address" in temporal.model_fields_set:
        return Target(
            settings,
            f"configured services: Temporal {temporal.address} namespace {temporal.namespace} "
            f"(TEMPORAL_ADDRESS)",
        )
    home = settings.mnemoflow.data_dir
    running = read_stack(home)
    if running is not None:
        return Target(running.apply(settings), _stack_line(home, running.temporal_address))
    raise NoTargetError(
        f"nothing to talk to: no mnemoflow dev stack runs in {home} (MNEMOFLOW_DATA_DIR) and "
        "TEMPORAL_ADDRESS is not set. Start `mnemoflow dev`, pass --data-dir DIR of a running "
        "one, or set TEMPORAL_ADDRESS, MILVUS_URI and REDIS_URL for a cluster."
    )


def _stack_line(data_dir: str | Path, address: str) -> str:
    return f"dev stack in {data_dir}: Temporal {address}"
