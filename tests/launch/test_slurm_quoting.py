"""Every value `halsift launch --slurm` writes into a script (array or not) goes through one check-and-quote
function (launch/launchers.py, script_value): #SBATCH values stay on their line, shell words stay words. The
scripts are run by bash here, with stand-ins for srun/scontrol and the interpreter, to see what they execute."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from halsift.launch.cli import main

COMMAND = ["score", "--detector", "random:seed=0", "--data", "/d/{000000..000001}.tar", "--out", "/s"]
MODES = {"array": ["--array", "2"], "nodes": ["--nodes", "2"]}


def _script(capsys, mode: str, *flags: str, command=COMMAND) -> tuple[int, str, str]:
    code = main(["launch", "--slurm", *MODES[mode], *flags, "--dry-run", "--", *command])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("flag, value", [
    ("--job-name", "x\ntouch PWNED"),  # the case (array scripts wrote the line)
    ("--partition", "gpu\ntouch PWNED"), ("--time", "1:00:00\ntouch PWNED"), ("--output", "log\ntouch PWNED"),
    ("--account", "a\ntouch PWNED"), ("--qos", "q\ntouch PWNED"),
    ("--job-name", "x\rtouch PWNED"), ("--job-name", "x\x00y"), ("--job-name", "x$(touch PWNED)"),
    ("--job-name", "x`touch PWNED`"), ("--job-name", 'x" --wrap="touch PWNED'),
    ("--sbatch-extra", "--constraint=a100\ntouch PWNED"), ("--setup", "module load x\ntouch PWNED"),
    ("--setup", "source venv\x00"), ("--python", "/env/python\x00"),
])
def test_a_value_that_would_leave_its_place_is_refused_naming_the_flag(capsys, tmp_path, mode, flag, value):
    code, text, err = _script(capsys, mode, f"{flag}={value}")
    assert code == 2 and text == "", text
    assert err.startswith(f"halsift launch: error: {flag}: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("mode", sorted(MODES))
def test_an_output_path_with_spaces_is_one_quoted_value(capsys, mode):
    code, text, err = _script(capsys, mode, "--output", "my logs/job %j.out", "--partition", "gpu a100")
    assert code == 0, err
    lines = text.splitlines()
    assert '#SBATCH --output="my logs/job %j.out"' in lines and '#SBATCH --partition="gpu a100"' in lines, text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def _stubs(bin_dir: Path) -> Path:
    """srun (runs its last word, the task's `bash -c` script), scontrol and hostname (one node) and a python
    that records its argv, each word ended by a NUL."""
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nexec bash -c "${@: -1}"\n')
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node0\n")
    (bin_dir / "hostname").write_text("#!/bin/bash\necho node0\n")
    (bin_dir / "python").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$ARGV_FILE"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir / "python"


@pytest.mark.parametrize("mode", sorted(MODES))
def test_command_words_reach_the_command_unchanged(capsys, tmp_path, mode):
    """`$(...)`, backquotes, quotes, spaces and newlines in the command after `--` are words, never shell code."""
    python = _stubs(tmp_path / "bin")
    words = ["score", "--detector", "random:seed=0", "--data", "/d/$(touch PWNED)/{0..1}.tar", "--out",
             "o `touch PWNED` 'q' \"d\"\nsecond line", "--batch-size", "4"]
    code, text, err = _script(capsys, mode, "--python", str(python), "--job-name", "job name with spaces",
                              "--setup", "export SETUP_RAN=1", command=words)
    assert code == 0, err
    env = {**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}", "ARGV_FILE": str(tmp_path / "argv"),
           "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_JOB_ID": "7", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "node0"}
    ran = subprocess.run(["bash", "-c", text], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert not (tmp_path / "PWNED").exists()
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    start = argv.index("halsift.launch.cli") + 1
    if mode == "array":
        assert argv[start:] == [*words, "--num-tasks", "2", "--task-index", "1"]
    else:
        assert argv[start:] == words


def test_array_and_node_scripts_share_one_writer():
    """Both writers quote through launchers.script_value: the same refusals, the same quoting."""
    from halsift.launch.launchers import SlurmSpec, sbatch_script, script_value
    from halsift.launch.slurm_array import ArraySpec, array_script

    assert script_value("--job-name", "a b", "header") == '"a b"'
    assert script_value("command", "a'b") == shlex.quote("a'b")
    with pytest.raises(ValueError, match=r"--output: 'x\\ny' contains '\\n' at position 1"):
        array_script(ArraySpec(tasks=2, output="x\ny"), COMMAND)
    with pytest.raises(ValueError, match=r"--output: 'x\\ny' contains '\\n' at position 1"):
        sbatch_script(SlurmSpec(output="x\ny"), COMMAND)
    with pytest.raises(ValueError, match="--sbatch-extra: expected one sbatch option starting with '--'"):
        sbatch_script(SlurmSpec(extra_sbatch=["constraint=a100"]), COMMAND)
