"""The `mnemoflow` command line and the search-attribute definitions it registers."""

from __future__ import annotations

import pytest

from mnemoflow.models import search_attributes as sa
from mnemoflow.ops import cli
from mnemoflow.worker.search_attributes import wanted


def test_every_command_has_a_subparser() -> None:
    parser = cli.build_parser()
    for name in cli.COMMANDS:
        extra = {"inspect": ["u"], "forget": ["u"], "rounds": ["u"], "user-key": ["u"]}
        extra["retry"] = ["u", "event-1"]
        extra["replay"] = ["history.json"]
        assert parser.parse_args([name, *extra.get(name, [])])


def test_unknown_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["frobnicate"])
    assert exc.value.code == 2


def test_search_attribute_types() -> None:
    assert wanted() == {
        "MnemoflowUser": "Keyword",
        "MnemoflowRound": "Int",
        "MnemoflowTrigger": "Keyword",
        "MnemoflowTheme": "Keyword",
        "MnemoflowOutcome": "Keyword",
    }
    assert len(sa.ALL_KEYS) == 5
