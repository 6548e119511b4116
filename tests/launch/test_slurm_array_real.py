"""`halsift launch --slurm --array 3` on a real single-node SLURM: three independent array tasks score a tiny world;
one task is SIGKILLed mid-part, the others take over what it held, the killed task rerun alone
(`sbatch --array=1 SCRIPT`) completes, and the scores equal a single-process run.

Skipped unless a SLURM answers here and this host is one of its nodes (see tests/launch/test_slurm_real.py; bring one up
with `.ci/slurm-up.sh`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pandas as pd
import pytest
from test_slurm_real import LOCAL, WHY_LOCAL, _wait_for

from halsift.corpus.scores import read_scores_df
from halsift.filtering.scoring.runner import score

pytestmark = pytest.mark.skipif(LOCAL is None, reason=WHY_LOCAL)
SPEC = "random:seed=3,delay=0.3"


def _rows(folder) -> pd.DataFrame:
    df = read_scores_df(folder)[["key", "sentence_index", "score"]]
    assert not df.duplicated(["key", "sentence_index"]).any()
    return df.sort_values(["key", "sentence_index"]).reset_index(drop=True)


def test_array_of_three_with_a_killed_task_equals_one_process(tmp_path):
    from halsift.synth.world import generate_world

    world = tmp_path / "world"
    generate_world(world, images=24, seed=1, bench_images=4, retrieval_images=12, pretrain_images=24, shard_size=4)
    scores, script = tmp_path / "scores", tmp_path / "array.sbatch"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    res = subprocess.run([sys.executable, "-m", "halsift.launch.cli", "launch", "--slurm", "--array", "3",
                          "--partition", LOCAL[0], "--cpu", "1", "--cpus-per-task", "1", "--time", "00:10:00",
                          "--job-name", "halsift-test-array", "--script", str(script),
                          "--output", str(tmp_path / "task-%A_%a.log"), "--submit", "--",
                          "score", "--detector", SPEC, "--data", str(world / "corpus"), "--out", str(scores),
                          "--batch-size", "4", "--no-progress"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "#SBATCH --array=0-2" in script.read_text()
    job = re.search(r"Submitted batch job (\d+)", res.stdout).group(1)

    # kill task 1 while it holds a part it has not finished
    victim, deadline = None, time.monotonic() + 240
    while victim is None and time.monotonic() < deadline:
        for c in (scores / "_claims").glob("*.parquet.*") if (scores / "_claims").exists() else []:
            try:
                info = json.loads(c.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if info.get("task", "").startswith("task-00001@") and not (scores / c.name.rsplit(".", 1)[0]).exists():
                victim = info["pid"]
                break
        time.sleep(0.05)
    assert victim is not None, f"task 1 never claimed a part: {sorted(os.listdir(tmp_path))}"
    os.kill(victim, 9)
    states = {i: _wait_for(f"{job}_{i}")["JobState"] for i in range(3)}
    assert states[1] == "FAILED" and states[0] == states[2] == "COMPLETED", states

    # the killed task alone, as a user reruns a failed array task
    rerun = subprocess.run(["sbatch", "--wait", "--array=1", str(script)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    m = json.loads((scores / "_manifest.json").read_text())
    assert m["status"] == "complete" and m["num_tasks"] == 3 and m["parts"] == 6
    assert m["parts_taken_over"] >= 1  # the part the killed task held was redone by another attempt
    assert sorted({k.split("@")[0] for k in m["tasks"]}) == ["0", "1", "2"]
    logs = "".join(p.read_text() for p in tmp_path.glob("task-*.log"))
    assert "halsift: array task 1 of 3" in logs and "task 1/3: scored" in logs, logs[-3000:]

    score(SPEC, world / "corpus", tmp_path / "one", batch_size=4, device="cpu", show_progress=False)
    pd.testing.assert_frame_equal(_rows(scores), _rows(tmp_path / "one"))
