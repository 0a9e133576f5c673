"""Contracts of the per-user data keys (crypto-shredding, docs/PRIVACY.md): pure, no I/O.

The forget saga calls `DESTROY_USER_KEY` as its last store step: every data key the user's
Temporal payloads were sealed with is erased, so what Temporal keeps of them can no longer be read.
"""

from __future__ import annotations

from pydantic import BaseModel

#: Activity name (workflows call activities by name).
DESTROY_USER_KEY = "mnemoflow.destroy_user_key"


class DestroyUserKeyInput(BaseModel):
    """Activity: erase every data key of this user."""

    user_id: str


class DestroyUserKeyOutput(BaseModel):
    """Data keys erased (0 when the user had none, or per-user keys are off)."""

    destroyed: int
