"""The one SIGKILL-mid-part helper of the engine tests (score tasks, per-shard corpus stages)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def claimed_unfinished(parts: Path) -> list[Path]:
    """Claims (``_claims/<part>.<attempt>``) on parts of ``parts`` that are not written."""
    return [c for c in (parts / "_claims").glob("*.parquet.*") if not (parts / c.name.rsplit(".", 1)[0]).exists()]


def kill_mid_part(cmd: list[str], env: dict, parts: Path, timeout: float = 180) -> str:
    """Start ``cmd``, SIGKILL it once it has written a part in ``parts`` and holds a claim on an unwritten one;
    asserts that exactly one such claim is left and returns the process's stderr."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not (
            list(parts.glob("part-*.parquet")) and claimed_unfinished(parts)):
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    err = proc.stderr.read().decode(errors="replace")
    assert len(claimed_unfinished(parts)) == 1, err[-2000:]
    return err
