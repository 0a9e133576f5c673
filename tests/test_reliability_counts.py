"""docs/RELIABILITY.md's counts are counted: every row a test records takes its Outcome from an
invariant checker (tests/support/invariants.py), never numbers written after the asserts.

Nine rows once said `lost=0, duplicated=0` as literals. Here every `reliability.record(...)`
call in the tests is read: it must pass `outcome=` (a name or a call, never a literal) and no
`lost=` or `duplicated=`; and no test builds an `Outcome(...)` itself (only the checkers do).
Ledger.record takes only an Outcome, and refuses anything else at run time too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.invariants import Outcome, no_messages, refused_or_stored
from tests.support.reliability import Ledger

TESTS = Path(__file__).resolve().parent
CHECKERS = TESTS / "support" / "invariants.py"


def _calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _is_record(call: ast.Call) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "record"
        and isinstance(func.value, ast.Name)
        and func.value.id == "reliability"
    )


def _named(call: ast.Call, name: str) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == name) or (
        isinstance(func, ast.Attribute) and func.attr == name
    )


def test_every_ledger_row_takes_its_counts_from_a_checker() -> None:
    problems: list[str] = []
    records = 0
    for path in sorted(TESTS.rglob("*.py")):
        where = path.relative_to(TESTS.parent)
        for call in _calls(path):
            if _named(call, "Outcome") and path != CHECKERS:
                problems.append(f"{where}:{call.lineno}: builds an Outcome itself")
            if not _is_record(call):
                continue
            records += 1
            keywords = {k.arg: k.value for k in call.keywords}
            for name in ("lost", "duplicated"):
                if name in keywords:
                    problems.append(f"{where}:{call.lineno}: passes {name}= (pass outcome=)")
            outcome = keywords.get("outcome")
            if outcome is None:
                problems.append(f"{where}:{call.lineno}: no outcome=")
            elif isinstance(outcome, ast.Constant):
                problems.append(f"{where}:{call.lineno}: outcome= is a literal")
    assert records >= 20, f"only {records} ledger rows found: is the scan looking elsewhere?"
    assert not problems, "\n".join(problems)


def test_the_ledger_refuses_counts_that_are_not_an_outcome() -> None:
    class Node:
        nodeid = "tests/x.py::test_x"

    class Request:
        node = Node()

    ledger = Ledger()
    with pytest.raises(TypeError):
        ledger.record(
            Request(),  # type: ignore[arg-type]
            key="k", kind="fault", what="w", happened="h", lost=0, duplicated=0,  # type: ignore[call-arg]
        )  # fmt: skip
    with pytest.raises(TypeError, match="Outcome"):
        ledger.record(Request(), key="k", kind="fault", what="w", happened="h", outcome=(0, 0))  # type: ignore[arg-type]
    counted = refused_or_stored(["a line", "another line"], ["another line"], ["a line"])
    ledger.record(Request(), key="k", kind="fault", what="w", happened="h", outcome=counted)  # type: ignore[arg-type]
    row = ledger.rows["k"]
    assert (row.said, row.lost, row.duplicated) == (2, 0, 0)
    lost = refused_or_stored(["a line", "gone line"], [], ["a line", "a line"])
    assert (lost.said, lost.lost, lost.duplicated) == (2, 1, 1)
    assert (no_messages() + counted).said == 2 and isinstance(counted, Outcome)
