"""`benchmarks/locomo.py --llm` wired to DeepSeek: run on a tiny conversation against the local
DeepSeek emulator (loopback, nothing leaves the machine). The memory models' calls go to the
emulator through the worker's own DeepSeek wiring, and the report gives their tokens and cost
per conversation, as the user workflow's ledger counted them."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.deepseek_emulator import DeepSeekEmulator, RecordedRequest, Reply

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

pytestmark = pytest.mark.integration

_TURN = re.compile(r"^\[(\d+)\] \S+ \S+ (human|ai)(?: \(([^)]*)\))?: (.*)$")


class ScriptedDeepSeek(DeepSeekEmulator):
    """Answers each memory call by the tool it is forced to use: a slice quotes every turn in
    one fragment with its enrichment, a tune gives weights, an induct an empty update."""

    def _answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(RecordedRequest(path, headers, body))
        tool = body["tools"][0]["function"]["name"]
        if tool == "SliceSchema":
            text = body["messages"][-1]["content"]
            turns = [m.groups() for m in map(_TURN.match, text.splitlines()) if m]
            lines = [
                f"{'User' if role == 'human' else 'Assistant'}"
                f"{f' ({name})' if name else ''}: {said}"
                for _, role, name, said in turns
            ]
            fragment = {
                "theme": "life",
                "types": ["episode"],
                "content": "\n".join(lines),
                "start_idx": 0,
                "end_idx": len(turns) - 1,
                "facts": ["Ann took up kayaking"],
                "entities": ["Ann"],
                "keywords": [{"said": "kayaking", "general": ["outdoor activity"]}],
            }
            return Reply.tool({"fragments": [fragment]})
        if tool == "TuneSchema":
            weights = {"alpha": 0.5, "beta": 0.2, "gamma": 0.3, "delta": 0.0}
            return Reply.tool({**weights, "w0": 0.1, "w1": 0.8, "w2": 0.1})
        return Reply.tool({})


def _conversation(path: Path) -> Path:
    data: dict[str, Any] = {"speaker_a": "Ann", "speaker_b": "Bo"}
    said = {
        1: ["I went kayaking yesterday for the first time.", "Brave! Where did you go?"],
        2: ["My sister Joanna visits next month.", "Lovely, say hi to Joanna."],
    }
    for n, texts in said.items():
        data[f"session_{n}_date_time"] = f"1:56 pm on {n + 7} May, 2023"
        data[f"session_{n}"] = [
            {"speaker": "Ann" if i % 2 == 0 else "Bo", "dia_id": f"D{n}:{i + 1}", "text": t}
            for i, t in enumerate(texts)
        ]
    qa = [
        {
            "question": "When did Ann go kayaking?",
            "answer": "7 May 2023",
            "evidence": ["D1:1"],
            "category": 2,
        },
        {
            "question": "Who visits Ann next month?",
            "answer": "Joanna",
            "evidence": ["D2:1"],
            "category": 4,
        },
    ]
    path.write_text(json.dumps({"conversation": data, "qa": qa}))
    return path


async def test_llm_mode_runs_on_deepseek_and_reports_the_cost_per_conversation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import locomo

    with ScriptedDeepSeek() as emu:
        monkeypatch.setenv("DEEPSEEK_API_KEY", "test-key")
        monkeypatch.setenv("DEEPSEEK_BASE_URL", emu.base_url)
        args = argparse.Namespace(
            data=str(_conversation(tmp_path / "tiny.json")),
            conversations=0,
            questions=0,
            budget=1200,
            reinforcement="off",
            llm=True,
        )
        result = await locomo.run(args)
        calls = len(emu.requests)

    assert result["models"] == "deepseek"
    (conv,) = result["conversations"].values()
    cost = conv["ingest"]["memory_models"]
    slices = [r for r in emu.requests if r.body["tools"][0]["function"]["name"] == "SliceSchema"]
    # a round per session at least (question threads may make rounds too), every call the
    # ledger counts made to the emulator (an attempt that timed out on a loaded machine is
    # made again, and counted once)
    assert 2 <= cost["by_operation"]["slice"]["calls"] <= len(slices)
    assert 0 < cost["calls"] <= calls
    assert cost["input_tokens"] > 0 and cost["output_tokens"] > 0 and cost["cost"] > 0
    # the model's enrichment and the resolved date reached what the question's call injected
    summary = conv["summary"]
    assert summary["mnemoflow"]["evidence_recall_all"] == 1.0
    report = locomo.cost_report(result)
    assert "| tiny | 4 | " in report and f"| all | | {cost['calls']} |" in report
