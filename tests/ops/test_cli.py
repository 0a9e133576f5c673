"""The `mnemoflow` command line and the search-attribute definitions it registers."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("command", ["inspect", "forget", "rounds", "user-key"])
@pytest.mark.parametrize("user", ["", "   ", "a\x00b"])
def test_unusable_user_id_is_a_usage_error(
    command: str, user: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before anything is contacted: `user-key ''` printed a key for the empty id."""
    with pytest.raises(SystemExit) as exc:
        cli.main([command, user])
    assert exc.value.code == 2
    assert "argument USER: user id" in capsys.readouterr().err


def test_replay_of_an_unreadable_file_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"{tmp_path}/missing.json"
    assert cli.main(["replay", missing, "--workflow-id", "w"]) == 1
    assert "No such file" in capsys.readouterr().err
    assert cli.main(["replay", str(tmp_path), "--workflow-id", "w"]) == 1  # a directory
    assert "Is a directory" in capsys.readouterr().err


def test_search_attribute_types() -> None:
    assert wanted() == {
        "MnemoflowUser": "Keyword",
        "MnemoflowRound": "Int",
        "MnemoflowTrigger": "Keyword",
        "MnemoflowTheme": "Keyword",
        "MnemoflowOutcome": "Keyword",
    }
    assert len(sa.ALL_KEYS) == 5
