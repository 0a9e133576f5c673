"""`<data_dir>/stack.json`: where a running `mnemoflow dev` stack can be reached.

The dev stack writes it (atomically) once every service answers and its worker polls, and
removes it on a clean stop, so its presence means "ready". `mnemoflow demo` and scripts read it
with `read_stack` and point their settings at the stack with `StackInfo.apply`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, Field, SecretStr

from mnemoflow.worker.settings import Settings

STACK_FILE = "stack.json"


class StackInfo(BaseModel):
    """Addresses and process ids of a running dev stack."""

    temporal_address: str
    namespace: str = "default"
    task_queue: str
    ui_url: str | None
    redis_url: str
    milvus_uri: str
    data_dir: str
    pid: int = Field(description="the `mnemoflow dev` process")
    service_pids: dict[str, int] = Field(default_factory=dict)

    def apply(self, settings: Settings) -> Settings:
        """`settings` pointed at this stack (everything else kept)."""
        # Per-user data keys that followed REDIS_URL follow the stack's Redis too.
        encryption = settings.temporal.encryption
        keys_url = encryption.data_keys_url
        if keys_url is not None and keys_url.get_secret_value() == settings.redis.url:
            encryption = encryption.model_copy(update={"data_keys_url": SecretStr(self.redis_url)})
        return settings.model_copy(
            update={
                "temporal": settings.temporal.model_copy(
                    update={
                        "address": self.temporal_address,
                        "namespace": self.namespace,
                        "task_queue": self.task_queue,
                        "encryption": encryption,
                    }
                ),
                "redis": settings.redis.model_copy(update={"url": self.redis_url}),
                "milvus": settings.milvus.model_copy(update={"uri": self.milvus_uri}),
            }
        )


def stack_path(data_dir: str | os.PathLike[str]) -> Path:
    """Where the stack file of `data_dir` lives."""
    return Path(data_dir) / STACK_FILE


def write_stack(info: StackInfo) -> Path:
    """Write the stack file atomically (readers never see half a file)."""
    path = stack_path(info.data_dir)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(info.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_stack(data_dir: str | os.PathLike[str]) -> StackInfo | None:
    """The stack running on `data_dir`, or None when there is none (or it died uncleanly)."""
    path = stack_path(data_dir)
    try:
        info = StackInfo.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    return info if _alive(info.pid) else None


def leftover_services(data_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Services of a stack that died without cleaning up and still run on `data_dir`.

    A pid only counts when its command line still names the data dir, so a recycled pid of an
    unrelated process is never reported.
    """
    try:
        info = StackInfo.model_validate(json.loads(stack_path(data_dir).read_text()))
    except FileNotFoundError:
        return {}
    if _alive(info.pid):
        return {}
    found = {}
    for name, pid in info.service_pids.items():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if info.data_dir.encode() in cmdline:
            found[name] = pid
    return found


def remove_stack(data_dir: str | os.PathLike[str]) -> None:
    """Delete the stack file if present."""
    stack_path(data_dir).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
