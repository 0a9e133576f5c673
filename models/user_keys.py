"""Contracts of the per-user data keys (crypto-shredding, docs/PRIVACY.md): pure, no I/O.

The forget saga calls `RETIRE_USER_KEY` as its last store step: the user's current generations
stop being used for new payloads, and the saga's run continues as new, sealed with a new one.
That new run calls `DESTROY_USER_KEY` for the retired generations first, so what Temporal keeps
of the forgotten run can no longer be read, while no running history needs them (a worker that
replays the forgotten run from its start can still read it until the continue-as-new).
Histories from before the retire step called `DESTROY_USER_KEY` for every generation.
"""

from __future__ import annotations

from pydantic import BaseModel

#: Activity names (workflows call activities by name).
DESTROY_USER_KEY = "mnemoflow.destroy_user_key"
RETIRE_USER_KEY = "mnemoflow.retire_user_key"


class DestroyUserKeyInput(BaseModel):
    """Activity: erase these generations of the user's data key (None: every generation)."""

    user_id: str
    generations: list[str] | None = None


class RetireUserKeyInput(BaseModel):
    """Activity: new payloads of this user get a new data key generation from now on."""

    user_id: str


class RetireUserKeyOutput(BaseModel):
    """The generations the user had at the retire; new payloads get a newer one."""

    generations: list[str]


class DestroyUserKeyOutput(BaseModel):
    """Data keys erased (0 when the user had none, or per-user keys are off)."""

    destroyed: int
