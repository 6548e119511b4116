"""`halsift launch --slurm --submit` on a real single-node SLURM: the generated sbatch script runs, srun starts the
task, torchrun inside rendezvouses on the first node's address, and two CPU ranks score a tiny world -- on one node,
and on two nodes (partition `pair`: two slurmds on this host whose names do not resolve, see .ci/slurm-up.sh).

Skipped unless a SLURM answers here and this host is one of its nodes (the job reads and writes pytest's tmp
folder). Bring one up with `.ci/slurm-up.sh` (Debian packages, about 15 s).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
from filtering_data import free_port


HOST = socket.gethostname().split(".")[0]
UP = re.compile(r"(idle|mixed|allocated|completing)\b")


def _nodes() -> tuple[list[list[str]], str]:
    """sinfo rows `node state cpus partition hostname`, or [] and why SLURM is not usable here."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return [], "no SLURM here (sbatch/sinfo not on PATH); start one with .ci/slurm-up.sh"
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %c %P %n"], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return [], "sinfo did not answer within 5 s (slurmctld down?); start one with .ci/slurm-up.sh"
    if out.returncode != 0:
        return [], f"sinfo failed: {out.stderr.strip()[:200]}; start one with .ci/slurm-up.sh"
    return [r.split() for r in out.stdout.splitlines() if len(r.split()) == 5], ""


ROWS, WHY = _nodes()
# one node of this host: the single-node job runs in its partition
LOCAL = next(([r[3].rstrip("*"), int(r[2])] for r in ROWS if r[0] == HOST and UP.match(r[1])), None)
# two nodes of a partition `pair`, both slurmds on this host (names need not resolve)
PAIR = [r for r in ROWS if r[3].rstrip("*") == "pair" and r[4] == HOST and UP.match(r[1])]
WHY_LOCAL = WHY or f"this host ({HOST}) is not a usable node of the SLURM that answers: {ROWS}"
WHY_PAIR = WHY or f"no partition `pair` of two usable slurmds on this host ({HOST}; see .ci/slurm-up.sh): {ROWS}"
pytestmark = pytest.mark.skipif(LOCAL is None and len(PAIR) < 2, reason=WHY_LOCAL)


def _launch(tmp_path, name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "halsift.launch.cli", "launch", "--slurm", "--time", "00:10:00",
                           "--job-name", f"halsift-test-{name}", "--master-port", str(free_port()),
                           "--script", str(tmp_path / f"{name}.sbatch"), "--output", str(tmp_path / f"{name}-%j.log"),
                           "--submit", *args], capture_output=True, text=True, timeout=330, env=env, cwd=tmp_path)


def _wait_for(job: str, timeout: float = 300) -> dict[str, str]:
    """JobState / ExitCode of a job once it has ended (scontrol keeps ended jobs for MinJobAge seconds)."""
    end = time.monotonic() + timeout
    while True:
        out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
        info = dict(re.findall(r"(\w+)=(\S+)", out))
        if info.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return info
        if time.monotonic() > end:
            subprocess.run(["scancel", job], timeout=30)
            pytest.fail(f"job {job} still {info.get('JobState')} after {timeout} s: {out[:500]}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from halsift.synth.world import generate_world

    out = tmp_path_factory.mktemp("slurm_world")
    generate_world(out, images=24, seed=1, bench_images=4, retrieval_images=12, pretrain_images=24, shard_size=12)
    return out


def _score(world, tmp_path, name: str, *slurm: str) -> None:
    """Submit a 2-rank CPU score job, wait for it, check it completed with both ranks."""
    scores = tmp_path / "scores"
    res = _launch(tmp_path, name, *slurm, "--", "score", "--detector", "random:seed=3", "--data",
                  str(world / "corpus"), "--out", str(scores), "--no-progress")
    assert res.returncode == 0, res.stdout + res.stderr
    job = re.search(r"Submitted batch job (\d+)", res.stdout).group(1)
    info = _wait_for(job)
    log = tmp_path / f"{name}-{job}.log"
    text = log.read_text() if log.exists() else "(no log)"
    state = {k: info.get(k) for k in ("JobState", "ExitCode", "Reason", "RunTime", "NodeList")}
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{state}\n{text[-4000:]}"
    assert "scored" in text and str(scores) in text, text[-4000:]  # rank 0's summary line reached the job log
    manifest = json.loads((scores / "_manifest.json").read_text())
    assert manifest["world_size"] == 2 and sorted(manifest["ranks"]) == [0, 1]


@pytest.mark.skipif(LOCAL is None, reason=WHY_LOCAL)
def test_one_node_job_runs_two_cpu_ranks_through_srun_and_torchrun(world, tmp_path):
    partition, cpus = LOCAL
    _score(world, tmp_path, "one", "--partition", partition, "--cpu", "2", "--cpus-per-task", str(min(2, cpus)))


@pytest.mark.skipif(len(PAIR) < 2, reason=WHY_PAIR)
def test_two_node_job_rendezvouses_across_srun_tasks(world, tmp_path):
    # node names halsift-n1/-n2 do not resolve: the script must rendezvous at the first node's NodeAddr
    _score(world, tmp_path, "two", "--partition", "pair", "--nodes", "2", "--cpu", "1", "--cpus-per-task", "1")


@pytest.mark.skipif(LOCAL is None, reason=WHY_LOCAL)
def test_failing_command_fails_the_job_and_wait_returns_nonzero(tmp_path):
    res = _launch(tmp_path, "fail", "--partition", LOCAL[0], "--wait", "--cpu", "1", "--cpus-per-task", "1", "--",
                  "stats", str(tmp_path / "missing"))
    assert res.returncode != 0, res.stdout + res.stderr
    job = re.search(r"Submitted batch job (\d+)", res.stdout).group(1)
    info = _wait_for(job, timeout=30)
    assert info["JobState"] == "FAILED", info
    assert "halsift stats: error" in (tmp_path / f"fail-{job}.log").read_text()
