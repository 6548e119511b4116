"""Scaling of independent score tasks: 1 vs N ``halsift score --num-tasks N`` processes at once (what a SLURM
array runs), each on one CPU core (``OMP_NUM_THREADS=1``), with the tiny CLIP scorer on JPEG shards.

    python benchmarks/score_tasks_scaling.py                   # 1 vs 2 tasks, 384 samples
    python benchmarks/score_tasks_scaling.py --tasks 1,2,4 --samples 2000

Prints sentences/s over the span from the first task's start to the last one's end (model loading included) and
the speed-up over one task (goal >= 1.8x for 2 tasks on a quiet 2-core machine). Never passes or fails on time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from score_throughput import make_corpus  # noqa: E402


def run_tasks(spec: str, data: Path, out: Path, batch: int, n: int) -> tuple[dict, float]:
    """``n`` task processes at once; returns the complete manifest and the wall time seen from here."""
    env = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "halsift.launch.cli", "score", "--detector", spec, "--data",
                               str(data), "--out", str(out), "--batch-size", str(batch), "--device", "cpu",
                               "--no-progress", "--num-tasks", str(n), "--task-index", str(i)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(n)]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(p.stderr.read().decode()[-2000:])
    return json.loads((out / "_manifest.json").read_text()), time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="1,2", help="task counts to compare")
    p.add_argument("--samples", type=int, default=384, help="samples (3 sentences each)")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=256)
    a = p.parse_args(argv)
    spec = "clip:arch=halsift-tiny,seed=0"
    tmp = Path(tempfile.mkdtemp(prefix="halsift-bench-tasks-"))
    data = make_corpus(tmp / "data", a.samples, max(1, a.samples // a.shards), a.image_size)
    print(f"samples={a.samples} sentences={3 * a.samples} shards={len(list(data.glob('*.tar')))} "
          f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    print(f"{'tasks':>5} {'sent/s':>9} {'wall s':>7} {'speed-up':>9}")
    base = None
    for n in [int(x) for x in a.tasks.split(",")]:
        m, wall = run_tasks(spec, data, tmp / f"out-{n}", a.batch_size, n)
        base = base or m["sentences_per_s"]
        print(f"{n:>5} {m['sentences_per_s']:>9.1f} {wall:>7.1f} {m['sentences_per_s'] / base:>8.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
