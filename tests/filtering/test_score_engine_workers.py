"""``--decode-workers`` honoured by every engine: the task engine and the Ray actor body read, decode and prepare in
worker processes and write the same scores as without them; torch's threads are set to the cores left beside the
workers unless the user chose them, and the manifest records the count."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from filtering_data import make_corpus

from halsift.filtering.scoring.parts import part_fingerprints, plan_parts
from halsift.filtering.scoring.threads import process_cores, threads_for, torch_threads
from halsift.filtering.scoring.job import ScoreJob
from halsift.launch.cli import main

CLIP = "clip:arch=halsift-tiny,pretrained=random,seed=0"


def test_threads_are_the_cores_left_beside_the_workers_and_restored_after():
    before = torch.get_num_threads()
    assert threads_for(1, 2) == 1 and threads_for(3, 8) == 5 and threads_for(4, 2) == 1
    with torch_threads(0, cores=8, env={}) as t:
        assert t == {"threads": before, "set_by": "torch"} and torch.get_num_threads() == before
    with torch_threads(3, cores=8, env={}) as t:
        assert t == {"threads": 5, "set_by": "halsift"} and torch.get_num_threads() == 5
    assert torch.get_num_threads() == before
    with torch_threads(1, cores=8, env={"OMP_NUM_THREADS": "3"}) as t:  # the user's choice is kept
        assert t == {"threads": before, "set_by": "user"} and torch.get_num_threads() == before
    with torch_threads(1, cores=8, env={"OMP_NUM_THREADS": "3"}, respect_env=False) as t:  # a Ray actor
        assert t == {"threads": 7, "set_by": "halsift"}
    assert torch.get_num_threads() == before
    assert process_cores({"LOCAL_WORLD_SIZE": "2"}) == max(1, process_cores({}) // 2)


def _same_parts(a, b) -> list[str]:
    names = sorted(p.name for p in a.glob("part-*.parquet"))
    assert names == sorted(p.name for p in b.glob("part-*.parquet"))
    for name in names:
        ta, tb = pq.read_table(a / name), pq.read_table(b / name)
        assert ta.drop(["score"]).equals(tb.drop(["score"]))
        # the same batches through the same model; only the pixels' path differs (numpy pickled vs in-process)
        assert max(abs(x - y) for x, y in zip(ta["score"].to_pylist(), tb["score"].to_pylist())) < 1e-4
    return names


def test_task_engine_with_decode_workers_writes_the_same_scores(tmp_path, monkeypatch, capsys):
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
              "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    data = make_corpus(tmp_path / "data", shards=3, per_shard=3, corrupt={"s0_00004": "image"})
    base = ["score", "--detector", CLIP, "--data", str(data), "--no-progress", "--batch-size", "4"]
    assert main([*base, "--out", str(tmp_path / "plain"), "--num-tasks", "1"]) == 0
    for i in (0, 1):  # two tasks, each reading up to two claimed parts at a time on two decode workers
        assert main([*base, "--out", str(tmp_path / "workers"), "--num-tasks", "2", "--task-index", str(i),
                     "--decode-workers", "2"]) == 0
    assert "task 1/2: scored 0 parts (0 items), 3 already done" in capsys.readouterr().out
    assert len(_same_parts(tmp_path / "plain", tmp_path / "workers")) == 3
    plain = json.loads((tmp_path / "plain" / "_manifest.json").read_text())
    m = json.loads((tmp_path / "workers" / "_manifest.json").read_text())
    assert m["engine"] == "tasks" and m["status"] == "complete" and m["skipped"]["total"] == 1
    assert (m["sentences"], m["samples"]) == (plain["sentences"], plain["samples"])
    assert plain["decode_workers"] == 0 and plain["torch_threads"]["set_by"] == "torch"
    assert m["decode_workers"] == 2
    assert m["torch_threads"] == {"threads": max(1, process_cores() - 2), "set_by": "halsift"}


def test_ray_actor_body_with_decode_workers_writes_the_same_parts(tmp_path):
    """A Ray actor's maker (what the score job sends an actor: a plain callable, no Ray needed) reading its dealt
    parts on decode workers gives the parts the rank-split run writes."""
    from halsift.execution.job import Place
    from halsift.filtering.scoring.runner import score

    data = make_corpus(tmp_path / "data", shards=2, per_shard=3, seed=4)
    score(CLIP, data, tmp_path / "one", batch_size=4, show_progress=False)
    parts, _ = plan_parts(data)
    fps = part_fingerprints(parts, json.loads((tmp_path / "one" / "_manifest.json").read_text())["detector_fp"])
    (tmp_path / "actor").mkdir()
    job = ScoreJob(CLIP, data, tmp_path / "actor", batch_size=4, device="cpu", decode_workers=2)
    work = job.open(Place())
    assert work.actor_cpus == 3  # the model's core and one per decode worker
    maker = work.actor(0, 1)
    got = {}
    try:
        maker.make(parts, None, got.__setitem__)
    finally:
        maker.close()
    assert maker.use_workers and maker.threads == {"threads": 1, "set_by": "halsift"}
    assert sorted(got) == _same_parts(tmp_path / "one", tmp_path / "actor")


def test_ray_engine_with_decode_workers_equals_one_process(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")
    from halsift.execution.engines import run_job
    from halsift.filtering.scoring.runner import score

    data = make_corpus(tmp_path / "data", shards=3, per_shard=3, seed=5)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:  # one actor reserving 1 + 1 CPUs: its model's core and its decode worker's
        m = run_job(ScoreJob(CLIP, data, tmp_path / "ray", batch_size=4, device="cpu", workers=1, decode_workers=1,
                             show_progress=False), "ray").stats
    finally:
        ray.shutdown()
    score(CLIP, data, tmp_path / "one", batch_size=4, show_progress=False)
    assert m["status"] == "complete" and m["decode_workers"] == 1
    assert m["torch_threads"] == {"threads": 1, "set_by": "halsift"}
    assert len(_same_parts(tmp_path / "one", tmp_path / "ray")) == 3
