"""The LoCoMo benchmark reads what a user downloads: a folder of conversation files as in the
repository's data, or the published list file (`locomo10.json`), with clear errors otherwise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _locomo_data import conversations, evidence_texts, load


def _conversation(tag: str, sessions: int = 2) -> dict:
    data: dict = {"speaker_a": f"Ann{tag}", "speaker_b": f"Bo{tag}"}
    for n in range(1, sessions + 1):
        data[f"session_{n}_date_time"] = f"1:56 pm on {n} May, 2023"
        data[f"session_{n}"] = [
            {"speaker": f"Ann{tag}", "dia_id": f"D{n}:1", "text": f"{tag} said {n} one"},
            {"speaker": f"Bo{tag}", "dia_id": f"D{n}:2", "text": f"{tag} replied {n} two"},
        ]
    return {
        "conversation": data,
        "qa": [
            {"question": f"{tag}?", "answer": "x", "evidence": ["D1:1", "D2:2"], "category": 1},
            {"question": "adversarial", "adversarial_answer": "y", "evidence": [], "category": 5},
        ],
    }


def test_folder_and_published_list_read_the_same(tmp_path: Path) -> None:
    folder = tmp_path / "split"
    folder.mkdir()
    for tag in ("a", "b", "c"):
        (folder / f"{tag}.json").write_text(json.dumps(_conversation(tag, 2 + len(tag))))
    listed = tmp_path / "locomo10.json"
    listed.write_text(
        json.dumps([{"sample_id": f"conv-{t}", **_conversation(t, 2 + len(t))} for t in "abc"])
    )
    split, published = conversations(folder), conversations(listed)
    assert [c.name for c in split] == ["a", "b", "c"]
    assert [c.name for c in published] == ["conv-a", "conv-b", "conv-c"]
    for one, other in zip(split, published, strict=True):
        assert [(t.dia_id, t.text, t.time) for t in one.turns] == [
            (t.dia_id, t.text, t.time) for t in other.turns
        ]
        assert len(one.questions) == len(other.questions) == 1  # category 5 left out
        assert evidence_texts(one, one.questions[0]) == evidence_texts(other, other.questions[0])
    assert [c.name for c in conversations(listed, 2)] == ["conv-a", "conv-b"]
    assert load(folder / "b.json").speaker_a == "Annb"
    with pytest.raises(ValueError, match="holds 3 conversations"):
        load(listed)


def test_unusable_files_say_what_is_wrong(tmp_path: Path) -> None:
    undated = _conversation("u")
    del undated["conversation"]["session_2_date_time"]
    (tmp_path / "undated.json").write_text(json.dumps(undated))
    with pytest.raises(ValueError, match="session 2 has no date_time"):
        conversations(tmp_path / "undated.json")
    (tmp_path / "odd.json").write_text(json.dumps([_conversation("o"), "not a conversation"]))
    with pytest.raises(ValueError, match="item 1 is not a LoCoMo conversation"):
        conversations(tmp_path / "odd.json")
    (tmp_path / "nobody.json").write_text(json.dumps({"conversation": {"speaker_a": "A"}}))
    with pytest.raises(ValueError, match="has no speaker_b"):
        conversations(tmp_path / "nobody.json")
