"""The LoCoMo replica's repeat filter reads what production's does (the last rounds' fragments
and the nearest ones, `activities.fragments.only_new`), not the whole history: a fact told
long ago and told again is still a repeat, an update of it is not, and the read stays bounded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _locomo_offline import Stored

from mnemoflow.activities import fragments as fragments_module
from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
from mnemoflow.models.fragments import Fragment

TOLD = "User: I adopted a grey cat called Pixel from the shelter on Elm Street.\nAssistant: Lovely!"
TOOLS = ["hammer", "lathe", "chisel", "router", "planer", "sander", "drill", "vise"]


def _fragment(n: int, content: str) -> Fragment:
    return Fragment(
        id=f"f{n}",
        user_id="u",
        theme="general",
        types=["chat"],
        content=content,
        created_at=1_000.0 + n,
        reinforced_at=1_000.0 + n,
        round_no=n + 1,
        thread_id=f"t{n}",
        start_pos=0,
        end_pos=2,
    )


def _filler(n: int) -> str:
    tool = TOOLS[n % len(TOOLS)]
    return f"User: in week {n} I fixed bicycle {n * 7} with the {tool} at workshop {n}."


def _long_history(stored: Stored, rounds: int) -> None:
    assert stored.add([_fragment(0, TOLD)])
    for n in range(1, rounds + 1):
        assert stored.add([_fragment(n, _filler(n))]), f"round {n} is new"


@pytest.fixture(scope="module")
def use() -> UniversalSentenceEncoderEmbeddings:
    return UniversalSentenceEncoderEmbeddings()


def test_a_fact_told_again_past_the_round_window_is_a_repeat_and_the_read_is_bounded(
    use: UniversalSentenceEncoderEmbeddings,
) -> None:
    rounds = fragments_module.REPEAT_ROUNDS + fragments_module.REPEAT_NEIGHBOURS + 20
    stored = Stored(use)
    _long_history(stored, rounds)
    assert stored.add([_fragment(900, TOLD)]) == []  # told long before the window: by its vector
    bound = fragments_module.REPEAT_ROUNDS + fragments_module.REPEAT_NEIGHBOURS
    assert 0 < stored.peers_read <= bound < len(stored.fragments)
    updated = TOLD.replace("Elm Street", "Oak Avenue")
    assert [f.id for f in stored.add([_fragment(901, updated)])] == ["f901"]
    assert len(stored.fragments) == rounds + 2
    assert stored.peers_read <= bound


def test_without_the_neighbours_the_old_fact_would_be_stored_again(
    use: UniversalSentenceEncoderEmbeddings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fragments_module, "REPEAT_NEIGHBOURS", 0)
    stored = Stored(use)
    _long_history(stored, fragments_module.REPEAT_ROUNDS + 20)
    assert [f.id for f in stored.add([_fragment(900, TOLD)])] == ["f900"]


def test_a_young_history_is_read_whole(use: UniversalSentenceEncoderEmbeddings) -> None:
    stored = Stored(use)
    _long_history(stored, 5)
    assert stored.add([_fragment(900, TOLD)]) == []
    assert stored.peers_read == 6
