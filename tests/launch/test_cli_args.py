"""Command-line shape: `halsift run RECIPE --dry-run key=value` (overrides anywhere after the recipe) and
`halsift launch --describe` (its flags built from one config class, LaunchConfig, like the other commands')."""

from __future__ import annotations

import dataclasses

import pytest

from halsift.corpus.config import field_default
from halsift.launch.cli import build_parser, main


def test_overrides_after_dry_run_and_force_are_applied(tmp_path, capsys):
    run = tmp_path / "elsewhere"
    assert main(["run", "quickstart", "--dry-run", f"run_dir={run}"]) == 0, capsys.readouterr().err
    assert f"run folder {run})" in capsys.readouterr().out
    # split around flags, in command-line order (the last word for a key wins)
    assert main(["run", "quickstart", "seed=3", "--dry-run", "--force", "score", f"run_dir={tmp_path / 'a'}",
                 f"run_dir={run}"]) == 0
    assert f"run folder {run})" in capsys.readouterr().out
    # and they are checked like the others
    assert main(["run", "quickstart", "--dry-run", "select.keep=1.5"]) == 2
    assert "select.keep" in capsys.readouterr().err


def test_other_commands_still_refuse_stray_words(capsys):
    with pytest.raises(SystemExit, match="^2$") as e:
        main(["stats", "a", "b"])
    assert e.value.code == 2 and "unrecognized arguments: b" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="^2$"):
        main(["run", "quickstart", "--dry-run", "--bogus", "a=1"])
    assert "unrecognized arguments: --bogus a=1" in capsys.readouterr().err


def test_force_names_a_stage(capsys):
    assert main(["run", "quickstart", "--dry-run", "--force", "scroe"]) == 2
    assert capsys.readouterr().err.startswith("halsift run: error: --force: unknown stage 'scroe'")


def test_launch_describe_lists_every_flag_with_default_and_meaning(capsys):
    from halsift.launch.cmd_launch import LaunchConfig

    with pytest.raises(SystemExit, match="^0$") as e:
        main(["launch", "--describe"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(LaunchConfig):
        assert out.count(f"\n{f.name}: ") + out.startswith(f"{f.name}: ") == 1, f.name
    assert "time: '24:00:00'  # wall-time limit" in out and "cpus_per_task: 32  #" in out
    assert "array: null  # a job array of N independent" in out


# per LaunchConfig field: flags giving it a value other than its default, and what the launcher then writes
# (the local command on stderr, the sbatch script on stdout), or the one line it refuses with
_LOCAL = ["--dry-run"]
_SLURM = ["--slurm", "--dry-run"]
LAUNCH_FLAGS = {
    "gpus": (["--gpus", "3", *_LOCAL], "accelerate.commands.launch --num_processes=3"),
    "cpu": (["--cpu", "3", *_LOCAL], "torch.distributed.run --nproc_per_node=3"),
    "nodes": (["--nodes", "2", "--backend", "torchrun", *_LOCAL], "--nnodes=2"),
    "node_rank": (["--nodes", "2", "--node-rank", "1", "--backend", "torchrun", *_LOCAL], "--node_rank=1"),
    "master_addr": (["--master-addr", "10.9.8.7", "--backend", "torchrun", *_LOCAL], "--master_addr=10.9.8.7"),
    "master_port": (["--master-port", "29877", "--backend", "torchrun", *_LOCAL], "--master_port=29877"),
    "backend": (["--gpus", "2", "--backend", "torchrun", *_LOCAL], "torch.distributed.run --nproc_per_node=2"),
    "dry_run": (_LOCAL, "+ "),
    "slurm": (_SLURM, "#SBATCH --nodes=1"),
    "script": (["--slurm", "--script", "{tmp}/job.sbatch"], "wrote {tmp}/job.sbatch"),
    "submit": (["--slurm", "--script", "{tmp}/job.sbatch", "--submit"], "--submit: sbatch not found on PATH"),
    "wait": ([*_SLURM, "--wait"], "--wait: only with --submit"),
    "output": ([*_SLURM, "--output", "LOGX"], "#SBATCH --output=LOGX"),
    "python": ([*_SLURM, "--python", "/opt/x/pythonX"], "/opt/x/pythonX -m accelerate"),
    "partition": ([*_SLURM, "--partition", "PARTX"], "#SBATCH --partition=PARTX"),
    "account": ([*_SLURM, "--account", "ACCX"], "#SBATCH --account=ACCX"),
    "qos": ([*_SLURM, "--qos", "QOSX"], "#SBATCH --qos=QOSX"),
    "time": ([*_SLURM, "--time", "07:06:05"], "#SBATCH --time=07:06:05"),
    "cpus_per_task": ([*_SLURM, "--cpus-per-task", "13"], "#SBATCH --cpus-per-task=13"),
    "job_name": ([*_SLURM, "--job-name", "JOBX"], "#SBATCH --job-name=JOBX"),
    "setup": ([*_SLURM, "--setup", "module load X", "--setup", "echo Y"], "module load X\necho Y\n"),
    "array": ([*_SLURM, "--array", "5"], "--num-tasks 5 --task-index \"$SLURM_ARRAY_TASK_ID\""),
    "max_parallel": ([*_SLURM, "--array", "5", "--max-parallel", "2"], "#SBATCH --array=0-4%2"),
    "requeue": ([*_SLURM, "--array", "5", "--requeue"], "#SBATCH --requeue"),
    "sbatch_extra": ([*_SLURM, "--sbatch-extra=--mem=77G"], "#SBATCH --mem=77G"),
}


@pytest.mark.parametrize("name", sorted(LAUNCH_FLAGS))
def test_each_launch_flag_changes_what_is_launched(name, tmp_path, capsys, monkeypatch):
    """Each LaunchConfig field, given on the command line, reaches the command or sbatch script the launcher
    writes (or its one-line refusal): the flag acts, not only parses."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here, whatever the machine has
    flags, want = LAUNCH_FLAGS[name]
    flags, want = [f.replace("{tmp}", str(tmp_path)) for f in flags], want.replace("{tmp}", str(tmp_path))
    try:
        code = main(["launch", *flags, "--", "score", "--x"])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    assert want in out.out + out.err, (name, out.out + out.err)
    if name not in ("dry_run", "slurm"):  # the same launch without the flag writes something else
        base = [f for f in _SLURM if "--slurm" in flags] or _LOCAL
        try:
            main(["launch", *base, "--", "score", "--x"])
        except SystemExit:
            pass
        plain = capsys.readouterr()
        assert want not in plain.out + plain.err, name
    assert code in (0, 2), (name, code)


def test_every_launch_setting_has_a_case_and_repeatable_flags_add_up():
    from halsift.launch.cmd_launch import LaunchConfig

    assert sorted(LAUNCH_FLAGS) == sorted(f.name for f in dataclasses.fields(LaunchConfig))
    args = build_parser().parse_args(["launch", "--setup", "a b", "--setup", "c", "--sbatch-extra=--x=1", "--",
                                      "score", "--setup", "d"])
    assert args.setup == ["a b", "c"] and args.sbatch_extra == ["--x=1"]
    assert args.argv == ["--", "score", "--setup", "d"]


def test_launch_is_in_the_config_reference():
    from halsift.launch.config_reference import reference

    text = reference()
    assert "### `halsift launch`" in text and "| `sbatch_extra` | `list[str]` | `[]` |" in text
