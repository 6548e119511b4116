"""Issue 53: the one prepared GPU script, ``benchmarks/gpu_device_run.sh``, runs end to end on a CPU with
``SUITE_ARGS=--smoke``: it installs halsift as on the device machine (no index, no dependencies), every part of the
suite (CLIP scoring, the judge, the product path, training) ends ``ok`` and writes its figures. A device call is
scarce (15 minutes a task): a part broken by a refactor must fail here, not on the card (the CLIP part once patched a
function that had moved and failed in 13 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.skipif(sys.platform != "linux", reason="the device script is bash for a Linux machine")
def test_the_device_script_runs_every_part_on_a_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WHL": str(tmp_path / "no-wheels"), "SUITE_ARGS": "--smoke",
           "LIMIT_S": "600", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    res = subprocess.run(["bash", "benchmarks/gpu_device_run.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    suite = json.loads((tmp_path / "out" / "gpu_suite.json").read_text())
    assert suite["smoke"] is True and set(suite["parts"]) == {"clip", "judge", "product", "train"}, suite["parts"]
    failed = {n: p for n, p in suite["parts"].items() if p["returncode"] != 0 or p["stopped"] or not p["figures"]}
    assert not failed, json.dumps(failed)[-3000:]
    for name in suite["parts"]:  # every part's figures written as it ended
        assert (tmp_path / "out" / "gpu_suite_parts" / f"{name}.json").stat().st_size > 2
    assert "imports: all ok" in log
