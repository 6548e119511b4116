"""`halsift launch --cpu 2 -- run RECIPE`: score on both ranks, every other stage on rank 0 alone; the other rank
waits for rank 0's stage records (no process group), gives up after HALSIFT_DIST_TIMEOUT or when rank 0 failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest
from filtering_data import free_port

from halsift.corpus.config import ConfigError
from halsift.launch.cli import main
from halsift.launch.recipe_ranks import (RankWaitError, Ranks, ranks_from_env, solo, wait_for_stage, write_failure)

RECIPE = """name: ranks
run_dir: {run}
stages: [world, score, select]
world: {{images: 300, bench_images: 6, pretrain_images: 8, retrieval_images: 4}}
score:
  detectors: {{random: "random:seed=0", oracle: oracle}}
select: {{keep: 0.5, unit: caption, agg: prune}}
wandb: {{mode: disabled}}
"""


def _launch_run(recipe, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HALSIFT_LAUNCH_ID", "WORLD_SIZE", "RANK")}
    env.update(WANDB_MODE="disabled", OMP_NUM_THREADS="1", HALSIFT_QUIET="1")
    port = str(free_port())  # a fresh free port per launch: a fixed one can still be held by an earlier test
    return subprocess.run([sys.executable, "-m", "halsift.launch.cli", "launch", "--cpu", "2", "--master-port", port,
                           "--", "run", str(recipe)], capture_output=True, text=True, timeout=timeout, env=env)


def test_launch_run_scores_on_every_rank_and_runs_the_rest_on_rank0(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(run=tmp_path / "two"))
    res = _launch_run(recipe)
    assert res.returncode == 0, res.stderr[-8000:]
    out = res.stdout
    # world and select ran once (on rank 0), rank 1 waited for world and then scored with rank 0
    assert out.count("[halsift run] world: running") == 1 and out.count("[halsift run] select: running") == 1
    assert "rank 1: waiting for rank 0's world" in out and "rank 1: score done" in out
    assert out.count("report: ") == 1
    run = tmp_path / "two"
    for name in ("random", "oracle"):
        m = json.loads((run / "score" / name / "corpus" / "_manifest.json").read_text())
        assert m["status"] == "complete" and m["world_size"] == 2 and m["ranks"] == [0, 1]
    launch = json.loads((run / "score" / "_done.json").read_text())["launch"]
    assert json.loads((run / "world" / "_done.json").read_text())["launch"] == launch
    assert json.loads((run / "select" / "_done.json").read_text())["launch"] == launch
    # the same selection as one process
    recipe.write_text(RECIPE.format(run=tmp_path / "one"))
    assert main(["run", str(recipe)]) == 0
    for name in ("random", "oracle"):
        a = pq.read_table(run / "select" / name / "kept.parquet").to_pydict()
        assert a == pq.read_table(tmp_path / "one" / "select" / name / "kept.parquet").to_pydict() and a["key"]
    # a rerun: rank 0 skips every stage, rank 1 learns it from rank 0's plan and does not score
    recipe.write_text(RECIPE.format(run=run))
    again = _launch_run(recipe)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "rank 1: score already complete" in again.stdout and "score: already complete, skipped" in again.stdout


def _done(stage_dir, launch: str, fingerprint: str = "fp") -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "_done.json").write_text(json.dumps({"launch": launch, "inputs": {"fingerprint": fingerprint}}))


def test_rank1_waits_for_this_launchs_record_only(tmp_path):
    ranks = Ranks(1, 2, "L.0")
    stage = tmp_path / "world"
    _done(stage, "OLD.0")  # a record from an earlier launch is not this launch's stage
    threading.Timer(0.3, _done, (stage, "L.0")).start()
    t0 = time.monotonic()
    assert wait_for_stage(tmp_path, stage, ranks, "fp", timeout=10, poll=0.02)["launch"] == "L.0"
    assert time.monotonic() - t0 >= 0.25


def test_rank1_gives_up_after_the_timeout_or_when_rank0_failed(tmp_path):
    ranks = Ranks(1, 2, "L.0")
    with pytest.raises(RankWaitError, match=r"waited 0 s for .*world/_done.json.*HALSIFT_DIST_TIMEOUT"):
        wait_for_stage(tmp_path, tmp_path / "world", ranks, "fp", timeout=0.1, poll=0.02)
    write_failure(tmp_path, Ranks(0, 2, "L.0"), "pretrain", ValueError("out of memory"))
    t0 = time.monotonic()
    with pytest.raises(RankWaitError, match=r"rank 1: rank 0 failed at stage pretrain \(out of memory\)"):
        wait_for_stage(tmp_path, tmp_path / "pretrain", ranks, "fp", timeout=60, poll=0.02)
    assert time.monotonic() - t0 < 5


def test_launch_id_and_solo(monkeypatch):
    env = {"WORLD_SIZE": "2", "RANK": "1"}
    with pytest.raises(ConfigError, match="HALSIFT_LAUNCH_ID"):
        ranks_from_env(env)
    assert ranks_from_env({**env, "HALSIFT_LAUNCH_ID": "x", "TORCHELASTIC_RESTART_COUNT": "2"}) == Ranks(1, 2, "x.2")
    assert ranks_from_env({**env, "TORCHELASTIC_RUN_ID": "job7"}).launch == "job7.0"
    assert ranks_from_env({**env, "TORCHELASTIC_RUN_ID": "none"} | {"WORLD_SIZE": "1"}) is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with solo():
        assert "WORLD_SIZE" not in os.environ and "LOCAL_RANK" not in os.environ
    assert os.environ["WORLD_SIZE"] == "2" and os.environ["LOCAL_RANK"] == "0"
