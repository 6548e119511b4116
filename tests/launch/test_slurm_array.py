"""`halsift launch --slurm --array N`: the generated array script, and the flags it refuses (exit 2, one line)."""

from __future__ import annotations

import subprocess

import pytest

from halsift.launch.cli import main


def _dry(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["launch", "--slurm", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_array_script_runs_score_as_independent_tasks(capsys):
    code, text, _ = _dry(capsys, "--array", "64", "--max-parallel", "16", "--requeue", "--partition", "gpu",
                         "--sbatch-extra=--constraint=a100", "--python", "/env/bin/python", "--dry-run", "--",
                         "score", "--detector", "random:seed=0", "--data", "/d/{000000..000009}.tar", "--out", "/s")
    assert code == 0
    lines = text.splitlines()
    for want in ("#SBATCH --array=0-63%16", "#SBATCH --nodes=1", "#SBATCH --ntasks=1", "#SBATCH --gpus=1",
                 "#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --partition=gpu",
                 "#SBATCH --constraint=a100", "#SBATCH --output=slurm-%A_%a.out"):
        assert want in lines, text
    assert lines[-1] == ("exec /env/bin/python -m halsift.launch.cli score --detector random:seed=0 --data "
                         "'/d/{000000..000009}.tar' --out /s --num-tasks 64 --task-index \"$SLURM_ARRAY_TASK_ID\"")
    assert "srun" not in text and "MASTER_ADDR" not in text  # no process group, no rendezvous
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_cpu_array_asks_for_no_gpu(capsys):
    code, text, _ = _dry(capsys, "--array", "3", "--cpu", "1", "--cpus-per-task", "2", "--dry-run", "--",
                         "score", "--detector", "oracle", "--data", "d", "--out", "o")
    assert code == 0 and "--gpus" not in text and "HALSIFT_FORCE_CPU=1" in text
    assert "#SBATCH --array=0-2\n" in text and "--cpus-per-task=2" in text


@pytest.mark.parametrize("args,msg", [
    (["--array", "4", "--gpus", "8"], "--array: each task is one process on one GPU (got --gpus 8)"),
    (["--array", "0"], "--array: expected a value in [1, inf), got 0"),
    (["--array", "4", "--max-parallel", "0"], "--max-parallel: expected a value in [1, inf), got 0"),
    (["--array", "4", "--nodes", "2"], "--array: every task is one node"),
    (["--array", "4", "--sbatch-extra=--array=0-9"], "--sbatch-extra '--array=0-9': set by --array itself"),
    (["--array", "4", "--sbatch-extra=constraint"], "--sbatch-extra: expected one sbatch option starting with '--'"),
])
def test_bad_array_flags_exit_2(capsys, args, msg):
    code, _, err = _dry(capsys, *args, "--dry-run", "--", "score", "--detector", "oracle", "--data", "d", "--out", "o")
    assert code == 2 and msg in err, err


def test_array_only_runs_score_and_sets_task_flags_itself(capsys):
    code, _, err = _dry(capsys, "--array", "2", "--dry-run", "--", "train", "clip", "--data", "s")
    assert code == 2 and "not 'train'" in err
    code, text, _ = _dry(capsys, "--array", "2", "--dry-run", "--", "select", "--scores", "s", "--keep", "0.2")
    assert code == 0 and text.rstrip().endswith("--keep 0.2 --num-tasks 2 --task-index \"$SLURM_ARRAY_TASK_ID\"")
    code, _, err = _dry(capsys, "--array", "2", "--dry-run", "--", "score", "--num-tasks", "2", "--out", "o")
    assert code == 2 and "--array: sets --num-tasks itself (2)" in err
    assert main(["launch", "--max-parallel", "2", "--dry-run", "--", "score"]) == 2
    assert "--max-parallel/--requeue: only with --slurm --array N" in capsys.readouterr().err
