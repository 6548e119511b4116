"""Issue 19: nothing silently wrong, nothing let in. One regression test per probed failure: each checks the exit
code, the one-line message and that nothing stale or foreign reached the output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from filtering_data import make_bench, make_corpus

from halsift.corpus.scores import read_scores_df
from halsift.launch.cli import main


def _err_line(capsys) -> str:
    """The one stderr line of a failed command (asserting there is exactly one)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _score(data, out, detector="oracle", *extra) -> int:
    return main(["score", "--detector", detector, "--data", str(data), "--out", str(out), "--no-progress", *extra])


# ------------------------------------------------------------------------------- 1. stale scores after the data changed
def test_rerun_after_shards_replaced_at_same_paths_rescores(tmp_path):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=5, seed=0)
    assert _score(data, tmp_path / "s") == 0
    other = make_corpus(tmp_path / "other", shards=2, per_shard=5, seed=7)
    for f in other.iterdir():  # another corpus at the same paths
        shutil.copy(f, data / f.name)
    assert _score(data, tmp_path / "s") == 0
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["parts_resumed"] == 0 and m["sentences_scored_this_run"] == m["sentences"] > 0
    assert set(read_scores_df(tmp_path / "s")["key"]) == {f"s7_{i:05d}" for i in range(10)}
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--keep", "0.3", "--no-progress"]) == 0
    sel = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert sel["precision"]["kept"] == 1.0 and sel["keys"]["only_in_scores"] == 0
    assert _score(data, tmp_path / "s") == 0  # unchanged now: reused
    assert json.loads((tmp_path / "s" / "_manifest.json").read_text())["parts_resumed"] == 2


def test_rerun_after_detector_checkpoint_changed_rescores(tmp_path):
    from halsift.corpus.fingerprint import spec_fingerprint

    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(b"a" * 100)
    spec = f"clip:arch=halsift-tiny,checkpoint={ckpt}"
    before = spec_fingerprint(spec)
    assert spec_fingerprint(spec) == before
    ckpt.write_bytes(b"b" * 100)
    assert spec_fingerprint(spec) != before


# ------------------------------------------------------------------------------- 2. stale bench split cache in recipes
def test_recipe_bench_split_cache_follows_its_bench(tmp_path):
    from halsift.corpus.bench import read_bench
    from halsift.launch.recipe import bench_subset

    a = make_bench(tmp_path / "a", captions=4, seed=0)
    b = make_bench(tmp_path / "b", captions=6, seed=3)
    run = tmp_path / "run"
    first = bench_subset(str(a), "test", run)
    assert {r.image for r in read_bench(first)} <= {str((tmp_path / "a" / "images" / f"im{c}.png")) for c in range(4)}
    again = bench_subset(str(b), "test", run)  # data.bench=OTHER
    assert again == first
    rows = read_bench(again)
    assert len(rows) == len(read_bench(b)) and all(str(tmp_path / "b") in r.image for r in rows)
    b.write_text(b.read_text().splitlines(keepends=True)[0])  # the same bench path, edited in place
    assert len(read_bench(bench_subset(str(b), "test", run))) == 1
