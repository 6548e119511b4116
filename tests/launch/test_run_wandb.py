"""`halsift score --wandb` / `halsift select --wandb` (WANDB_MODE=offline): one offline run beside the output holding
throughput, skipped counts and the kept fraction; without the flag, no run."""

from __future__ import annotations

import time

import pytest
from filtering_data import make_corpus

from halsift.launch.cli import main
from halsift.launch.run_wandb import log_recipe_stage, select_metrics

pytest.importorskip("wandb")


def _run_file(folder, *keys: bytes) -> bytes:
    """The offline run's record file, once it holds ``keys`` (wandb's service may flush it just after finish())."""
    runs = list((folder / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, runs
    deadline = time.monotonic() + 20
    while not all(k in runs[0].read_bytes() for k in keys) and time.monotonic() < deadline:
        time.sleep(0.2)
    return runs[0].read_bytes()


def test_score_and_select_log_offline_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    corpus = make_corpus(tmp_path / "c", shards=2, per_shard=4, seed=1)
    assert main(["score", "--detector", "random:seed=0", "--data", str(corpus), "--out", str(tmp_path / "s"),
                 "--no-progress", "--wandb"]) == 0
    keys = (b"items_per_s", b"part/items_per_s", b"skipped", b"parse_failures")
    data = _run_file(tmp_path / "s", *keys)
    for key in keys:
        assert key in data, key
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(corpus), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--no-progress", "--wandb"]) == 0
    keys = (b"kept_fraction", b"candidates_per_s", b"skipped", b"samples_written")
    data = _run_file(tmp_path / "sel", *keys)
    for key in keys:
        assert key in data, key
    assert "wandb (offline): " in capsys.readouterr().out
    # the resumable select logs too; a select without --wandb does not
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(corpus), "--out", str(tmp_path / "res"),
                 "--keep", "0.5", "--no-progress", "--resumable", "--wandb"]) == 0
    assert b"kept_fraction" in _run_file(tmp_path / "res", b"kept_fraction")
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(corpus), "--out", str(tmp_path / "no"),
                 "--keep", "0.5", "--no-progress"]) == 0
    assert not (tmp_path / "no" / "wandb").exists()
    # a recipe's stage: one run, each filter's figures under its name
    log_recipe_stage("select", tmp_path / "stage", {"mem": tmp_path / "sel", "res": tmp_path / "res"}, "offline",
                     "halsift", "tiny")
    data = _run_file(tmp_path / "stage", b"mem/kept_fraction", b"res/kept_fraction")
    assert b"mem/kept_fraction" in data and b"res/kept_fraction" in data


def test_select_metrics_read_both_manifests():
    common = {"candidates": 40, "kept_units": 10, "samples_written": 9, "wall_time_s": 2.0,
              "precision": {"input": 0.5, "kept": 0.8}, "corrupt_shards": ["a.tar: bad"]}
    mem = select_metrics({**common, "skipped": {"total": 1}})
    res = select_metrics({**common, "skipped_samples": {"count": 1}})
    assert mem == res
    assert mem["kept_fraction"] == 0.25 and mem["skipped"] == 1 and mem["corrupt_shards"] == 1
    assert mem["candidates_per_s"] == 20.0 and mem["precision/kept"] == 80.0  # no "scale": shares, read as %
    assert mem["sentence_precision/kept"] is None  # a manifest from before the field
    whole = select_metrics({**common, "skipped": {"total": 1}, "sentence_precision": {"input": 0.6, "kept": 0.9}})
    assert (whole["sentence_precision/input"], whole["sentence_precision/kept"]) == (60.0, 90.0)
