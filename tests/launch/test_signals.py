"""SIGTERM and SIGINT of a running command: one line naming the command and what it kept, exit 143 / 130, and a
rerun that resumes from what was kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filtering_data import make_corpus

ENV = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}


def _score_cmd(data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "halsift.launch.cli", "score", "--detector", "random:seed=0,delay=0.25",
            "--data", str(data), "--out", str(out), "--batch-size", "4", "--no-progress"]


def _stop_after_first_part(cmd: list[str], out: Path, sig: int) -> tuple[int, str]:
    """Start ``cmd``, send ``sig`` once its first part is written; its exit code and stderr."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # even if ignored here
    deadline = time.time() + 120
    while not list(out.glob("part-*.parquet")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize("sig, name, code", [(signal.SIGTERM, "SIGTERM", 143), (signal.SIGINT, "SIGINT", 130)])
def test_a_stopped_score_says_what_it_kept_and_resumes(tmp_path, sig, name, code):
    data = make_corpus(tmp_path / "c", shards=6, per_shard=5, seed=1)
    out = tmp_path / "scores"
    rc, err = _stop_after_first_part(_score_cmd(data, out), out, sig)
    assert rc == code, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1] == (f"halsift score: stopped by {name}; the finished parts in {out} are kept; the same "
                         "command resumes"), err[-2000:]
    assert "Traceback" not in err
    done = list(out.glob("part-*.parquet"))
    assert 1 <= len(done) < 6, "stopped part-way"
    assert not (out / ".halsift.lock").exists()  # the lock was released on the way out
    rerun = subprocess.run(_score_cmd(data, out), env=ENV, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    m = json.loads((out / "_manifest.json").read_text())
    assert m["status"] == "complete" and m["parts_resumed"] == len(done)


def test_sigterm_handler_is_restored_after_main(tmp_path, capsys):
    """``main`` installs its SIGTERM handler for the command only (tests and notebooks call it in-process)."""
    from halsift.launch.cli import main

    before = signal.getsignal(signal.SIGTERM)
    assert main(["stats", str(tmp_path / "absent")]) == 2
    assert signal.getsignal(signal.SIGTERM) is before
    capsys.readouterr()


def test_sigterm_unwinds_the_command_like_ctrl_c():
    """SIGTERM raises Terminated (a KeyboardInterrupt) inside the command: its own clean-up (``finally``) runs, then
    one line and 143; a command without resumable output says that nothing half-written is left."""
    code = (
        "import os, signal, sys, time\n"
        "import halsift.launch.cmd_stats as cmd\n"
        "from halsift.launch.cli import main\n"
        "def slow(args):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(10)\n"
        "    finally:\n"
        "        print('cleaned up', flush=True)\n"
        "cmd.run = slow\n"
        "sys.exit(main(['stats', 'x']))\n")
    t0 = time.time()
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 143 and done.stdout == "cleaned up\n", (done.returncode, done.stdout, done.stderr)
    assert done.stderr.strip() == ("halsift stats: stopped by SIGTERM; no half-written file is left (files are "
                                   "written atomically); run the command again")
    assert time.time() - t0 < 9  # the sleep was interrupted
