"""Rules the test suite keeps: every ``pytest.raises`` pins the message it expects (``match=``)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def raises_without_match(source: str) -> list[int]:
    """Line numbers of ``pytest.raises(...)`` calls (context-manager form) without a ``match=`` keyword."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "raises"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"
                and len(node.args) == 1 and not any(k.arg == "match" for k in node.keywords)):
            lines.append(node.lineno)
    return lines


def test_every_pytest_raises_pins_its_message():
    bad = [f"{p.relative_to(TESTS)}:{n}" for p in sorted(TESTS.rglob("*.py"))
           for n in raises_without_match(p.read_text())]
    assert bad == [], f"pytest.raises without match= (pin the expected message): {bad}"


def test_the_check_sees_a_raises_without_match():
    src = ("import pytest\nwith pytest.raises(ValueError):\n    pass\n"
           "with pytest.raises(ValueError, match='x'):\n    pass\n")
    assert raises_without_match(src) == [2]


def test_monkeypatch_refuses_a_patch_its_undo_would_delete(monkeypatch):
    """A torch buffer is served by ``Module.__getattr__``: pytest >= 9.2 deletes it on undo, so the suite's
    monkeypatch refuses to patch it (the shared-fixture damage of issue 39); methods and plain attributes still patch."""
    import pytest
    import torch

    from conftest import GuardedMonkeyPatch, lost_on_undo

    m = torch.nn.Linear(2, 2)
    m.register_buffer("mask", torch.ones(2))
    assert isinstance(monkeypatch, GuardedMonkeyPatch)
    assert lost_on_undo(m, "mask") and lost_on_undo(m, "weight")
    with pytest.raises(AssertionError, match="patch a copy"):
        monkeypatch.setattr(m, "mask", None)
    with pytest.raises(AssertionError, match="patch a copy"):
        monkeypatch.delattr(m, "weight")
    assert m.mask is not None
    monkeypatch.setattr(m, "forward", lambda x: x)  # a method: undo restores the class's
    monkeypatch.setattr(m, "in_features", 3)  # in the instance __dict__: undo restores it
    assert not lost_on_undo(m, "forward") and not lost_on_undo(m, "in_features")
