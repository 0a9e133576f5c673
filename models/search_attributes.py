"""Custom search attributes of mnemoflow, as typed keys.

Pure definitions (only `temporalio.common`), so workflows can import them inside the sandbox.
They let the Temporal UI answer "which rounds of user X failed, and why": rounds carry the
user, their number, what triggered them, the main theme and the outcome.
Registration on a server lives in `mnemoflow.worker.search_attributes`.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

#: The user id (pseudonymised when the worker is configured so).
USER = SearchAttributeKey.for_keyword("MnemoflowUser")
#: The round number within the user's memory.
ROUND = SearchAttributeKey.for_int("MnemoflowRound")
#: What made the round due: handover, budget, ceiling, explicit, retry.
TRIGGER = SearchAttributeKey.for_keyword("MnemoflowTrigger")
#: The first theme a round produced (the one an operator most likely searches for).
THEME = SearchAttributeKey.for_keyword("MnemoflowTheme")
#: How the round ended: completed, failed, ...
OUTCOME = SearchAttributeKey.for_keyword("MnemoflowOutcome")

#: Every custom key, in a stable order (registration and docs iterate over this).
ALL_KEYS: tuple[SearchAttributeKey, ...] = (USER, ROUND, TRIGGER, THEME, OUTCOME)
