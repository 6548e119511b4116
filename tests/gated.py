"""Processes released together: each imports what it needs, says it is ready, and starts only once every one is
(two start-ups seconds apart on a loaded machine cannot let one task finish every part before the other claims
one)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

GATED = """
import pathlib, sys, time
{prelude}
import torch, halsift.execution.engines, halsift.filtering.scoring.job, halsift.filtering.scoring.runner
from halsift.launch.cli import main
ready, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.01)
sys.exit(main(sys.argv[3:]))
"""


def run_gated(commands: list[list[str]], folder: Path, env: dict, prelude: str = "",
              timeout: float = 120) -> list[tuple[int, str, str]]:
    """Run ``halsift`` ``commands`` (argv after ``halsift``) as processes released together; ``prelude``: Python run
    first in each (e.g. registering a family). Returns each one's ``(exit code, stdout, stderr)``."""
    go = folder / "go"
    procs = [subprocess.Popen([sys.executable, "-c", GATED.format(prelude=prelude), str(folder / f"ready{i}"),
                               str(go), *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, argv in enumerate(commands)]
    deadline = time.time() + 120
    while not all((folder / f"ready{i}").exists() for i in range(len(procs))) and time.time() < deadline:
        time.sleep(0.02)
    go.touch()
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]
