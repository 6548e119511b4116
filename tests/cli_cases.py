"""What the per-stage reliability tests share: run a command in-process, read its one-line error, a scored corpus."""

from __future__ import annotations

import pytest
from filtering_data import make_corpus

from halsift.launch.cli import main


def _err_line(capsys) -> str:
    """The one stderr line of a failed command (asserting there is exactly one)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _score(data, out, detector="oracle", *extra) -> int:
    return main(["score", "--detector", detector, "--data", str(data), "--out", str(out), "--no-progress", *extra])


# ------------------------------------------------------------------------------- 3. select validates its inputs
def _select(scores, data, out, *extra) -> int:
    return main(["select", "--scores", str(scores), "--data", str(data), "--out", str(out), "--keep", "0.5",
                 "--no-progress", *extra])


@pytest.fixture()
def scored(tmp_path):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=5, seed=3)
    assert _score(data, tmp_path / "rand", "random:seed=1") == 0
    return data, tmp_path / "rand"


def _alias_bomb(keys: bool) -> list[str]:
    """9 levels of 9 aliases to the level below (9^9 items expanded), as list items or as mapping entries."""
    levels = []
    for i in range(9):
        name = chr(ord("a") + i)
        body = "[x, x, x, x, x, x, x, x, x]" if i == 0 else f"[{', '.join(['*' + chr(ord(name) - 1)] * 9)}]"
        levels.append(f"{name + ': ' if keys else ''}&{name} {body}")
    return levels
