"""One door for the cascade (issue 50): ``halsift.score`` and ``halsift score`` give byte-identical parts on the
local and the tasks engines, and a task that waits for another's share of a judged stage keeps its judge loaded
(the sample and the band share it): each process loads the judge once."""

from __future__ import annotations

import os
from pathlib import Path

from filtering_data import make_corpus
from gated import run_gated

import halsift
from halsift.launch.cli import main

CASCADE = "cascade:cheap=[random:seed=0],judge=[oracle],budget=0.5"
TESTS = Path(__file__).parents[1]


def _parts(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("part-*.parquet"))}


def test_library_and_command_write_the_same_cascade_parts_on_every_engine(tmp_path, monkeypatch):
    for k in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"):
        monkeypatch.delenv(k, raising=False)
    data = make_corpus(tmp_path / "c", shards=3, per_shard=8, seed=3)
    assert main(["score", "--detector", CASCADE, "--data", str(data), "--out", str(tmp_path / "cli"),
                 "--no-progress"]) == 0
    local = halsift.score(CASCADE, data, tmp_path / "lib", show_progress=False)
    assert local["status"] == "complete" and local["cascade"]["judge_calls"] > 0
    for i in (0, 1):
        tasks = halsift.score(CASCADE, data, tmp_path / "tasks", engine="tasks", num_tasks=2, task_index=i,
                              show_progress=False)
    assert tasks["status"] == "complete" and tasks["cascade"]["judge_calls"] == local["cascade"]["judge_calls"]
    want = _parts(tmp_path / "cli")
    assert len(want) == 3 and _parts(tmp_path / "lib") == want and _parts(tmp_path / "tasks") == want


# two task processes released together (both import first): the judged stages are shared between them, so one
# finishes its share of the sample (and of the band) while the other still holds parts, and waits for them
PRELUDE = """from halsift.filtering.detectors.spec import register_family
register_family("counting", "counting_judge:CountingJudge")"""


def test_a_task_waiting_on_another_loads_the_judge_once(tmp_path):
    data = make_corpus(tmp_path / "c", shards=6, per_shard=6, seed=4)
    log = tmp_path / "loads.txt"
    spec = "cascade:cheap=[random:seed=0],judge=[counting:delay=0.4],budget=0.6,sample=0.5"
    env = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1", "HALSIFT_TASK_POLL_S": "0.2",
           "PYTHONPATH": str(TESTS), "COUNTING_JUDGE_LOG": str(log)}
    for k in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"):
        env.pop(k, None)
    runs = run_gated([["score", "--detector", spec, "--data", str(data), "--out", str(tmp_path / "out"),
                       "--batch-size", "4", "--num-tasks", "2", "--task-index", str(i), "--no-progress"]
                      for i in range(2)], tmp_path, env, prelude=PRELUDE)
    assert [rc for rc, _, _ in runs] == [0, 0], runs
    import json

    # both tasks made parts of the sample: the first to finish its share waited for the other's before the plan
    runs = [json.loads(f.read_text()) for f in (tmp_path / "out" / "_stages" / "sample" / "_tasks").glob("*.json")]
    assert sorted(r["task_index"] for r in runs if r["parts_made"]) == [0, 1], runs
    pids = log.read_text().split()
    assert len(set(pids)) == 2, pids  # both tasks judged (they shared the sample and the band) ...
    assert sorted(pids.count(p) for p in set(pids)) == [1, 1], pids  # ... each with the one judge it loaded


def test_a_set_level_cheap_stage_runs_through_the_door(tmp_path):
    """A cascade's stages go through the engine's door like any score job: a cheap ensemble that normalises over
    the whole set (norm=zscore) is scored as its members then their combination, not batch by batch (where each
    batch would be normalised on its own, silently); on the tasks engine it is refused in one line as for score."""
    import pandas as pd
    import pytest

    from halsift.corpus.scores import read_scores_df
    from halsift.execution.engines import EngineError

    data = make_corpus(tmp_path / "c", shards=3, per_shard=8, seed=3)
    cheap = "ensemble:members=[random:seed=0;random:seed=1],norm=zscore"
    out = tmp_path / "out"
    assert halsift.score(f"cascade:cheap=[{cheap}],judge=[oracle],budget=0.5", data, out,
                         show_progress=False)["status"] == "complete"
    stage = out / "_stages" / "cheap"
    assert (stage / "_members" / "0").is_dir() and (stage / "_members" / "1").is_dir()
    whole = halsift.score(cheap, data, tmp_path / "whole", show_progress=False)
    assert whole["status"] == "complete"
    got = read_scores_df(stage).sort_values(["key", "sentence_index"]).reset_index(drop=True)
    want = read_scores_df(tmp_path / "whole").sort_values(["key", "sentence_index"]).reset_index(drop=True)
    pd.testing.assert_series_equal(got["score"], want["score"])
    with pytest.raises(EngineError, match="scores at set level"):
        halsift.score(f"cascade:cheap=[{cheap}],judge=[oracle],budget=0.5", data, tmp_path / "t", engine="tasks",
                      num_tasks=2, task_index=0, show_progress=False)
