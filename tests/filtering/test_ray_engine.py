"""`score --engine ray` on a local Ray cluster (ray.init(num_cpus=2)): the same scores as one process, and a
worker SIGKILLed mid-part has its part redone by a replacement. Skipped when Ray (an optional extra) is absent."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from pathlib import Path

import pandas as pd
import pytest
from filtering_data import make_corpus

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")

from halsift.corpus.scores import read_scores_df  # noqa: E402
from halsift.execution.engines import ENGINES, run_job  # noqa: E402
from halsift.filtering.scoring.job import ScoreJob  # noqa: E402
from halsift.filtering.scoring.runner import score  # noqa: E402


def score_ray(job: ScoreJob, on_start=None) -> dict:
    """``job`` on the Ray engine; the folder's complete manifest."""
    return ENGINES["ray"].run(job, on_start=on_start).stats


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "HALSIFT_QUIET": "1",
                                       "PYTHONPATH": str(Path(__file__).parents[1])}})
    yield
    ray.shutdown()


def _rows(folder) -> pd.DataFrame:
    df = read_scores_df(folder)[["key", "sentence_index", "score"]]
    assert not df.duplicated(["key", "sentence_index"]).any()
    return df.sort_values(["key", "sentence_index"]).reset_index(drop=True)


def test_ray_equals_one_process_and_reruns_skip(cluster, tmp_path):
    corpus = make_corpus(tmp_path / "c", shards=6, per_shard=5, seed=1)
    m = score_ray(ScoreJob("random:seed=0", corpus, tmp_path / "ray", batch_size=4, device="cpu", workers=2))
    assert m["status"] == "complete" and m["engine"] == "ray" and m["workers"] == 2 and m["parts"] == 6
    assert m["ranks"] == [0, 1]  # both actors scored parts
    score("random:seed=0", corpus, tmp_path / "one", batch_size=4, show_progress=False)
    pd.testing.assert_frame_equal(_rows(tmp_path / "ray"), _rows(tmp_path / "one"))
    again = score_ray(ScoreJob("random:seed=0", corpus, tmp_path / "ray", batch_size=4, device="cpu", workers=2))
    assert again["parts_resumed"] == 6 and again["sentences_scored_this_run"] == 0


def test_killed_worker_part_is_redone(cluster, tmp_path):
    corpus = make_corpus(tmp_path / "c", shards=6, per_shard=5, seed=2)
    killed = []

    def kill_one(actors):
        pid = ray.get(actors[0].pid.remote())
        timer = threading.Timer(1.0, lambda: (os.kill(pid, signal.SIGKILL), killed.append(pid)))
        timer.start()

    m = score_ray(ScoreJob("random:seed=0,delay=0.3", corpus, tmp_path / "ray", batch_size=4, device="cpu",
                           workers=2), on_start=kill_one)
    assert killed and m["status"] == "complete" and m["parts_redone"] >= 1
    score("random:seed=0", corpus, tmp_path / "one", batch_size=4, show_progress=False)
    pd.testing.assert_frame_equal(_rows(tmp_path / "ray"), _rows(tmp_path / "one"))


def test_cli_engine_ray(cluster, tmp_path, capsys):
    from halsift.launch.cli import main

    corpus = make_corpus(tmp_path / "c", shards=2, per_shard=3, seed=3)
    assert main(["score", "--detector", "random:seed=0", "--data", str(corpus), "--out", str(tmp_path / "o"),
                 "--engine", "ray", "--workers", "2", "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "ray: 2 workers, 0 parts redone" in out and "in 2 parts" in out


def test_basic_dedup_and_embed_on_ray_equal_one_process(cluster, tmp_path):
    """The per-shard corpus stages (execution/stage_job.py) on Ray write the parts one process writes."""
    import pyarrow.parquet as pq

    from halsift.filtering.scoring.embed import EmbedJob
    from halsift.launch.cli import main
    from test_basic_filters import FAST, _shards
    from test_dedup import _corpus

    data = _shards(tmp_path / "shards", per_shard=2)
    for flags, out in ((["--engine", "ray", "--workers", "2"], "ray"), ([], "one")):
        assert main(["basic", "--data", str(data), "--out", str(tmp_path / f"b-{out}"), *flags, *FAST]) == 0
    rows = [sorted((r for p in sorted((tmp_path / f"b-{o}").glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()),
                   key=lambda r: r["key"]) for o in ("ray", "one")]
    assert rows[0] == rows[1] and len(rows[0]) == 8
    corpus = _corpus(tmp_path)
    for flags, out in ((["--engine", "ray"], "ray"), ([], "one")):
        assert main(["dedup", "--data", str(corpus), "--out", str(tmp_path / f"d-{out}"), *flags,
                     "--no-progress"]) == 0
    dups = [sorted(pq.read_table(tmp_path / f"d-{o}" / "duplicates.parquet").to_pylist(), key=lambda r: r["key"])
            for o in ("ray", "one")]
    assert dups[0] == dups[1] and {r["key"] for r in dups[0]} == {"c20", "c21", "c22"}
    tiny = "clip:arch=halsift-tiny,pretrained=random,seed=0"
    job = EmbedJob(tiny, corpus, tmp_path / "e-ray", batch_size=5, show_progress=False, workers=2)
    r = run_job(job, engine="ray")
    assert r.complete and r.stats["parts_embedded_this_run"] == 3
    run_job(dataclasses.replace(job, out=tmp_path / "e-one", workers=None))
    for p in sorted((tmp_path / "e-one").glob("part-*.parquet")):
        assert pq.read_table(tmp_path / "e-ray" / p.name).equals(pq.read_table(p))
