"""Scoring as independent tasks: N tasks (in turn or overlapping) equal one process, claims never lose or duplicate
a part, a task SIGKILLed mid-part reruns to identical output, and the manifest is complete only at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from file_ids import file_ids
from gated import run_gated
from kill_mid_part import kill_mid_part
from filtering_data import make_corpus

from halsift.corpus.scores import read_scores_df
from halsift.execution.claims import CLAIMS, ClaimBoard, TaskError, task_from_env, task_order
from halsift.execution.engines import ENGINES
from halsift.filtering.scoring.job import ScoreJob
from halsift.filtering.scoring.runner import score
from halsift.launch.cli import main

ENV = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
for _k in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"):
    ENV.pop(_k, None)


def _rows(folder) -> pd.DataFrame:
    df = read_scores_df(folder)[["key", "sentence_index", "score"]]
    assert not df.duplicated(["key", "sentence_index"]).any()
    return df.sort_values(["key", "sentence_index"]).reset_index(drop=True)


def _job(corpus, out) -> ScoreJob:
    return ScoreJob("random:seed=0", corpus, out, batch_size=4, show_progress=False)


def score_task(job: ScoreJob, n: int, i: int, **kw) -> dict:
    """Task ``i`` of ``n`` on the tasks engine; its run record (``complete`` says whether it completed the folder)."""
    import dataclasses

    s = ENGINES["tasks"].run(dataclasses.replace(job, num_tasks=n, task_index=i), **kw)
    return {**s.run, "complete": s.complete}


def _manifest(folder) -> dict:
    return json.loads((Path(folder) / "_manifest.json").read_text())


@pytest.fixture
def corpus(tmp_path):
    return make_corpus(tmp_path / "c", shards=6, per_shard=5, seed=1)


def _task_cmd(data, out, n, i, delay=0.0, *extra):
    spec = "random:seed=0" + (f",delay={delay}" if delay else "")
    return [sys.executable, "-m", "halsift.launch.cli", "score", "--detector", spec, "--data", str(data),
            "--out", str(out), "--batch-size", "4", "--num-tasks", str(n), "--task-index", str(i), "--no-progress",
            *extra]


def test_task_index_from_slurm_array_environment():
    assert task_from_env(env={}) is None
    env = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "5"}
    assert task_from_env(env=env) == (4, 2)
    assert task_from_env(3, 1, env=env) == (3, 1)  # flags win over the environment
    with pytest.raises(TaskError, match="--task-index: expected 0 <= index < 3"):
        task_from_env(3, 3, env={})
    with pytest.raises(TaskError, match="--task-index: give --num-tasks"):
        task_from_env(None, 1, env={})


def test_task_order_starts_with_own_share_then_steals_from_the_others():
    parts = list(range(7))
    assert task_order(parts, 3, 1, steal=False) == [1, 4]
    assert task_order(parts, 3, 1) == [1, 4, 2, 5, 0, 3, 6]
    assert sorted(task_order(parts, 3, 2)) == parts


def test_three_tasks_in_turn_equal_one_process_and_only_the_last_completes(corpus, tmp_path):
    score("random:seed=0", corpus, tmp_path / "one", batch_size=4, show_progress=False)
    out = tmp_path / "tasks"
    runs = []
    for i in range(3):
        runs.append(score_task(_job(corpus, out), 3, i, steal=False))
        assert _manifest(out)["status"] == ("complete" if i == 2 else "running")
    assert [r["parts_made"] for r in runs] == [2, 2, 2] and [r["complete"] for r in runs] == [False, False, True]
    pd.testing.assert_frame_equal(_rows(out), _rows(tmp_path / "one"))
    m, one = _manifest(out), _manifest(tmp_path / "one")
    assert m["engine"] == "tasks" and m["num_tasks"] == 3 and m["task_runs"] == 3 and m["ranks"] == [0, 1, 2]
    assert (m["sentences"], m["samples"], m["parts"]) == (one["sentences"], one["samples"], one["parts"])
    assert not list((out / CLAIMS).iterdir())  # every claim released
    # select reads the folder as it is
    assert main(["select", "--scores", str(out), "--data", str(corpus), "--out", str(tmp_path / "sel"), "--keep",
                 "0.5", "--no-progress"]) == 0
    kept = pd.read_parquet(tmp_path / "sel" / "kept.parquet")
    assert len(kept) == round(0.5 * one["sentences"] + 1e-9)


def test_one_task_steals_what_no_one_holds(corpus, tmp_path):
    run = score_task(_job(corpus, tmp_path / "o"), 3, 0)
    assert run["parts_made"] == 6 and run["complete"]


def test_two_overlapping_tasks_split_the_parts_without_duplicates(corpus, tmp_path):
    out = tmp_path / "o"
    # both think they are task 0 of 1 (a requeued task running beside its old copy): claims keep them apart.
    # 0.6 s per batch (~8 s of work), both released at once after their start-ups (GATED)
    runs = run_gated([_task_cmd(corpus, out, 1, 0, 0.6)[3:]] * 2, tmp_path, ENV)
    assert [rc for rc, _, _ in runs] == [0, 0], runs
    m = _manifest(out)
    assert m["status"] == "complete" and m["task_runs"] == 2
    assert sum(t["parts_scored"] for t in m["tasks"].values()) == 6  # no part scored twice
    assert all(t["parts_scored"] >= 1 for t in m["tasks"].values())  # they really overlapped
    score("random:seed=0", corpus, tmp_path / "one", batch_size=4, show_progress=False)
    pd.testing.assert_frame_equal(_rows(out), _rows(tmp_path / "one"))


def test_a_task_that_ends_while_another_finishes_the_folder_is_counted(corpus, tmp_path, monkeypatch):
    """Two tasks that end together both finish the folder; the one that read the task records before the other's
    was written must finish again, or the manifest (written last by it) forgets a task (seen in CI: task_runs 1)."""
    import halsift.filtering.scoring.parts as parts

    out, real, late = tmp_path / "o", parts.finish_manifest, []

    def finish_while_another_task_ends(*a, **kw):
        if not late:  # the other task's record lands just after this one read the records
            late.append({"task_index": 0, "num_tasks": 1, "host": "elsewhere", "pid": 1, "start": time.time(),
                         "end": time.time(), "parts_made": 0, "items": 0, "parts_taken_over": 0,
                         "making_time_s": 0.0})
            (out / "_tasks" / "task-00000.elsewhere.1.json").write_text(json.dumps(late[0]))
        return real(*a, **kw)

    monkeypatch.setattr(parts, "finish_manifest", finish_while_another_task_ends)
    assert score_task(_job(corpus, out), 1, 0)["complete"]
    m = _manifest(out)
    assert m["status"] == "complete" and m["task_runs"] == 2 and "0@elsewhere:1" in m["tasks"]


def test_task_killed_mid_part_reruns_to_identical_output(tmp_path):
    corpus = make_corpus(tmp_path / "c", shards=3, per_shard=3, seed=2)
    out = tmp_path / "killed"
    cmd = _task_cmd(corpus, out, 2, 1, 0.4)  # about 1 s per part: the kill lands inside the second part
    kill_mid_part(cmd, ENV, out, timeout=120)
    finished = file_ids(out)
    assert len(finished) == 1
    assert _manifest(out)["status"] == "running"
    res = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "scored 2 parts" in res.stdout and "1 taken over from dead tasks" in res.stdout, res.stdout
    after = file_ids(out)  # the finished part reused as it is (file and record), the other two made
    assert {n: after[n] for n in finished} == finished and len(after) == 3
    m = _manifest(out)
    assert m["status"] == "complete" and m["parts_taken_over"] == 1 and m["parts_resumed"] == 1
    score("random:seed=0", corpus, tmp_path / "one", batch_size=4, show_progress=False)
    pd.testing.assert_frame_equal(_rows(out), _rows(tmp_path / "one"))


def test_live_claims_are_respected_and_stale_ones_taken_over(tmp_path):
    a = ClaimBoard(tmp_path, "a", stale_after=30)
    b = ClaimBoard(tmp_path, "b", stale_after=30)
    claim = a.try_claim("part-x.parquet")
    assert claim is not None and b.try_claim("part-x.parquet") is None
    assert b.held(["part-x.parquet", "part-y.parquet"]) == ["part-x.parquet"]
    claim.release()  # heartbeat stops: a node that died without a trace
    old = time.time() - 60
    os.utime(claim.path, (old, old))
    taken = b.try_claim("part-x.parquet")
    assert taken is not None and taken.path.name == "part-x.parquet.1" and b.taken_over == 1
    b.finish("part-x.parquet", taken)
    assert not list((tmp_path / CLAIMS).iterdir())
    with pytest.raises(TaskError, match="--claim-timeout"):
        ClaimBoard(tmp_path, "c", stale_after=0)


def test_of_two_tasks_reaching_one_attempt_at_once_exactly_one_wins(tmp_path, monkeypatch):
    """A claim is never held twice: ``b`` looked for claims before ``a``'s appeared (both saw none), so both try
    attempt 0; the exclusive link lets only ``a`` have it, and ``a``'s claim is left as ``a`` wrote it."""
    a = ClaimBoard(tmp_path, "a", stale_after=30)
    b = ClaimBoard(tmp_path, "b", stale_after=30)
    claim = a.try_claim("part-x.parquet")
    held = claim.path.read_text()
    monkeypatch.setattr(b, "_attempts", lambda part: [])  # what b saw an instant before a's claim
    assert b.try_claim("part-x.parquet") is None
    assert claim.path.read_text() == held and json.loads(held)["task"] == "a"
    assert sorted(p.name for p in (tmp_path / CLAIMS).iterdir()) == ["part-x.parquet.0"]  # no temp file left
    claim.release()


def test_a_claim_always_names_its_process_so_a_killed_claimer_is_noticed_at_once(tmp_path):
    """A claim is written whole before it appears (no window in which a SIGKILL leaves an empty claim that only
    times out after --claim-timeout); a temp file left by a process killed before linking blocks nothing."""
    import json
    import socket
    import subprocess
    import sys

    board = ClaimBoard(tmp_path, "a", stale_after=600)
    (tmp_path / CLAIMS / ".part-x.parquet.0.somehost.1.tmp").write_text("")  # killed before its link
    claim = board.try_claim("part-x.parquet")
    assert claim is not None and claim.path.name == "part-x.parquet.0"
    info = json.loads(claim.path.read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    claim.release()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    claim.path.write_text(json.dumps({**info, "pid": int(dead.stdout)}))  # its claimer died (SIGKILL) just now
    assert board.held(["part-x.parquet"]) == []
    again = board.try_claim("part-x.parquet")
    assert again.path.name == "part-x.parquet.1"
    again.release()


def test_cli_task_errors_exit_2(corpus, tmp_path, capsys):
    base = ["score", "--detector", "random:seed=0", "--data", str(corpus), "--out", str(tmp_path / "o")]
    assert main([*base, "--num-tasks", "2", "--task-index", "2"]) == 2
    assert "--task-index: expected 0 <= index < 2, got 2" in capsys.readouterr().err
    assert main([*base, "--claim-timeout", "5"]) == 2
    assert "--claim-timeout: only with --num-tasks" in capsys.readouterr().err
    assert main([*base, "--engine", "ray", "--num-tasks", "2"]) == 2
    assert "--engine ray: Ray deals the parts itself" in capsys.readouterr().err
    assert main([*base, "--workers", "2"]) == 2
    assert "--address/--workers: only with --engine ray" in capsys.readouterr().err


def test_dist_timeout_from_environment():
    from datetime import timedelta

    from halsift.execution.claims import dist_timeout_kwargs

    assert dist_timeout_kwargs({}) == {}
    assert dist_timeout_kwargs({"HALSIFT_DIST_TIMEOUT": "7200"}) == {"timeout": timedelta(seconds=7200)}
    with pytest.raises(TaskError, match="HALSIFT_DIST_TIMEOUT='soon': expected a number of seconds > 0"):
        dist_timeout_kwargs({"HALSIFT_DIST_TIMEOUT": "soon"})
