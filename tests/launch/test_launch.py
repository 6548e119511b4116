"""Launcher command lines and sbatch scripts (the multi-process runs themselves are tested with score/train)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from halsift.launch.cli import main
from halsift.launch.launchers import LaunchSpec, SlurmSpec, launch_command, sbatch_script


def test_torchrun_command_on_cpu_names_every_rank_setting():
    argv = launch_command(LaunchSpec(procs_per_node=2, cpu=True), ["score", "--out", "x y"], python="py")
    assert argv[:3] == ["py", "-m", "torch.distributed.run"]
    assert "--nproc_per_node=2" in argv and "--nnodes=1" in argv and "--node_rank=0" in argv
    # the halsift command follows the module entry unchanged, spaces kept inside one argument
    assert argv[-5:] == ["-m", "halsift.launch.cli", "score", "--out", "x y"]


def test_accelerate_command_for_multi_node_gpus():
    spec = LaunchSpec(procs_per_node=8, nodes=2, node_rank=1, master_addr="10.0.0.1", master_port=1234)
    argv = launch_command(spec, ["train", "clip"], python="py")
    assert argv[2] == "accelerate.commands.launch"
    for flag in ("--num_processes=16", "--num_machines=2", "--machine_rank=1", "--main_process_ip=10.0.0.1",
                 "--main_process_port=1234", "--multi_gpu"):
        assert flag in argv


@pytest.mark.parametrize("spec, message", [
    (LaunchSpec(procs_per_node=0), "^--gpus/--procs must be >= 1, got 0$"),
    (LaunchSpec(nodes=2, node_rank=2), r"^--node-rank must be in \[0, 2\), got 2$"),
    (LaunchSpec(backend="mpi"), "^--backend must be torchrun, accelerate or auto, got 'mpi'$")])
def test_bad_launch_specs_are_rejected(spec, message):
    with pytest.raises(ValueError, match=message):
        launch_command(spec, ["score"])


@pytest.mark.parametrize("backend", ["accelerate", "torchrun"])
def test_sbatch_script_runs_one_task_per_node_with_rendezvous(tmp_path, backend):
    text = sbatch_script(SlurmSpec(nodes=4, gpus_per_node=8, partition="gpu", account="proj", backend=backend),
                         ["score", "--data", "s/{000000..000099}.tar", "--out", "o"])
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --partition=gpu" in text
    srun = [line for line in text.splitlines() if line.startswith("srun")]
    assert len(srun) == 1
    inner = shlex.split(srun[0])[-1]  # what each node's task runs
    assert "$SLURM_NODEID" in inner or "$SLURM_JOB_ID" in inner  # expanded per task, not in the batch shell
    assert "s/{000000..000099}.tar" in shlex.split(inner)  # brace pattern reaches halsift unexpanded
    if backend == "accelerate":
        assert "--num_processes=32" in inner and "--num_machines=4" in inner
    else:
        assert "--nproc_per_node=8" in inner and "--nnodes=4" in inner
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_launch_cli_writes_script_and_rejects_bad_usage(tmp_path, capsys):
    script = tmp_path / "j.sbatch"
    assert main(["launch", "--slurm", "--nodes", "2", "--gpus", "4", "--script", str(script), "--",
                 "select", "--keep", "0.2"]) == 0
    assert "select --keep 0.2" in script.read_text()
    assert main(["launch", "--dry-run"]) == 2
    assert "no command given" in capsys.readouterr().err
    assert main(["launch", "--cpu", "2", "--gpus", "1", "--", "score"]) == 2


def test_cpu_sbatch_script_requests_no_gpus_and_runs_torchrun_ranks():
    text = sbatch_script(SlurmSpec(nodes=2, cpu_procs=3, cpus_per_task=4, backend="torchrun"), ["stats", "w"],
                         python="/env/bin/python")
    assert "--gpus" not in text and "HALSIFT_FORCE_CPU=1" in text
    srun = next(line for line in text.splitlines() if line.startswith("srun"))
    assert "--cpus-per-task=4" in shlex.split(srun)  # srun 22.05+ does not inherit it from the batch step
    inner = shlex.split(srun)[-1]
    assert inner.startswith("/env/bin/python -m torch.distributed.run") and "--nproc_per_node=3" in inner
    with pytest.raises(ValueError, match="torchrun"):  # accelerate --cpu would start a single process
        sbatch_script(SlurmSpec(cpu_procs=2), ["stats", "w"])


def test_launch_cli_submits_through_sbatch(tmp_path, monkeypatch, capsys):
    """--submit hands the written script to sbatch (here a stand-in that records its argv); --wait passes through."""
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'argv'}\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    script = tmp_path / "cpu.sbatch"
    assert main(["launch", "--slurm", "--cpu", "2", "--output", str(tmp_path / "log-%j.out"), "--script",
                 str(script), "--submit", "--wait", "--", "stats", "w"]) == 3  # sbatch's exit code comes back
    assert (tmp_path / "argv").read_text().split() == ["--wait", str(script)]
    text = script.read_text()
    assert f"#SBATCH --output={tmp_path / 'log-%j.out'}" in text and "--nproc_per_node=2" in text
    assert shlex.quote(sys.executable) + " -m torch.distributed.run" in text  # this interpreter, not PATH's python
    assert main(["launch", "--slurm", "--cpu", "2", "--backend", "accelerate", "--dry-run", "--", "stats", "w"]) == 2
    assert main(["launch", "--slurm", "--wait", "--dry-run", "--", "stats", "w"]) == 2
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["launch", "--slurm", "--script", str(script), "--submit", "--", "stats", "w"]) == 2
    assert "sbatch not found" in capsys.readouterr().err


def test_launch_dry_run_prints_the_command(capsys):
    assert main(["launch", "--cpu", "2", "--dry-run", "--", "stats", "x"]) == 0
    err = capsys.readouterr().err
    assert "torch.distributed.run" in err and "--nproc_per_node=2" in err and "stats x" in err


def test_help_is_instant_and_lists_commands():
    out = subprocess.run([sys.executable, "-m", "halsift.launch.cli", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "launch" in out.stdout
    mods = subprocess.run([sys.executable, "-c", "import sys, halsift.launch.cli as c; c.build_parser(); "
                           "print(sorted(m for m in ('torch','open_clip','transformers') if m in sys.modules))"],
                          capture_output=True, text=True, timeout=60)
    assert mods.stdout.strip() == "[]", mods.stdout + mods.stderr


def _node_command(backend: str, node: str = "1") -> list[str]:
    """What node ``node``'s task of a 2-node SLURM script runs, with SLURM's and the script's variables filled in."""
    text = sbatch_script(SlurmSpec(nodes=2, gpus_per_node=4, backend=backend), ["score", "--out", "o"], python="py")
    assert "c10d" not in text
    inner = shlex.split(next(line for line in text.splitlines() if line.startswith("srun")))[-1]
    for var, value in {"$SLURM_NODEID": node, "$MASTER_ADDR": "10.0.0.7", "$MASTER_PORT": "29555"}.items():
        inner = inner.replace(var, value)
    return shlex.split(inner)


def test_slurm_accelerate_renders_the_same_static_rendezvous_as_torchrun():
    """Issue 51: the accelerate backend still rendered c10d (whose agents fail a finished job when the store's host
    exits first; fixed for torchrun in 1d09cf2). Through accelerate's own argument handling, its script hands
    torch.distributed.run the torchrun backend's static rendezvous: node rank from $SLURM_NODEID, the store at the
    first node's address."""
    import torch.distributed.run as distrib_run
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    acc, tr = _node_command("accelerate"), _node_command("torchrun")
    assert acc[2] == "accelerate.commands.launch" and tr[2] == "torch.distributed.run"
    args = launch_command_parser().parse_args(acc[3:])
    args.mixed_precision, args.dynamo_backend = "no", "no"  # what accelerate's config step fills in
    prepare_multi_gpu_env(args)  # turns accelerate's flags into torch.distributed.run's
    want = distrib_run.get_args_parser().parse_args(tr[3:])
    for key in ("nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port", "rdzv_backend"):
        assert str(getattr(args, key)) == str(getattr(want, key)), key
    assert want.rdzv_backend == "static" and not getattr(args, "rdzv_endpoint", "") and str(args.node_rank) == "1"
