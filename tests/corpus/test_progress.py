"""Progress in logs: one plain line per interval (rate, share of the total, ETA) instead of a tqdm bar."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from filtering_data import make_corpus

from halsift.corpus.progress import LineProgress, progress


def test_line_progress_prints_rate_total_eta_and_postfix():
    buf = io.StringIO()
    bar = LineProgress(desc="score task 1/4", unit="sent", total=200, every=0, stream=buf)
    bar.update(50)
    bar.set_postfix(parts=3)
    bar.update(50)
    bar.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3  # two updates and the final line
    assert lines[0].startswith("score task 1/4: 50 sent, ") and "25.0% of 200, ETA " in lines[0]
    assert lines[1].startswith("score task 1/4: 100 sent, ") and "50.0% of 200" in lines[1]
    assert lines[1].endswith(", parts=3") and " sent/s, elapsed " in lines[1]


def test_line_progress_is_silent_within_one_interval_and_iterates():
    buf = io.StringIO()
    assert list(LineProgress(range(5), desc="x", every=3600, stream=buf)) == [0, 1, 2, 3, 4]
    assert buf.getvalue() == ""


def test_progress_in_a_log_is_a_line_logger_unless_disabled(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert isinstance(progress(desc="d"), LineProgress)
    assert not isinstance(progress(desc="d", disable=True), LineProgress)
    monkeypatch.setenv("RANK", "3")
    assert not isinstance(progress(desc="d"), LineProgress)  # other ranks stay silent


def test_score_task_logs_progress_lines_under_slurm_like_env(tmp_path):
    corpus = make_corpus(tmp_path / "c", shards=2, per_shard=3)
    env = {**os.environ, "HALSIFT_QUIET": "1", "HALSIFT_PROGRESS_EVERY": "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).parents[1])}
    res = subprocess.run([sys.executable, "-m", "halsift.launch.cli", "score", "--detector", "random:seed=0",
                          "--data", str(corpus), "--out", str(tmp_path / "o"), "--num-tasks", "1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [x for x in res.stderr.splitlines() if x.startswith("score task 0/1: ")]
    assert lines and " sent/s" in lines[-1] and "parts_scored=2, parts=2" in lines[-1], res.stderr[-2000:]
    assert "\r" not in res.stderr  # no tqdm bar in the log
