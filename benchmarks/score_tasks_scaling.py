"""Scaling of independent score tasks: 1 vs N ``halsift score --num-tasks N`` processes at once (what a SLURM
array runs), each on one CPU core (``OMP_NUM_THREADS=1``), with the tiny CLIP scorer on JPEG shards.

    python benchmarks/score_tasks_scaling.py                   # 1 vs 2 tasks, 384 samples
    python benchmarks/score_tasks_scaling.py --tasks 1,2,4 --samples 2000

Prints sentences/s over the span from the first task's start to the last one's end (model loading included) and
the speed-up over one task (goal >= 1.8x for 2 tasks on a quiet 2-core machine), with the CPU seconds the tasks used
(start-up included), the cores they kept busy and sentences per CPU second: one task already keeps more than one
core busy (its read-ahead thread decodes while the model runs), so on 2 cores the speed-up is bounded by
2 / (cores one task keeps busy); equal sentences per CPU second means the work itself scales linearly.
Never passes or fails on time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from score_throughput import make_corpus  # noqa: E402


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def startup_cpu(spec: str) -> float:
    """CPU seconds one process spends before it scores anything: imports (open_clip alone takes ~4 s here) and
    building the detector."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cpu0 = _children_cpu()
    subprocess.run([sys.executable, "-c", "import halsift.filtering.scoring.runner\nfrom halsift.filtering.detectors.spec import "
                    f"load_detector\nload_detector({spec!r})"], env=env, check=True)
    return _children_cpu() - cpu0


def run_tasks(spec: str, data: Path, out: Path, batch: int, n: int) -> tuple[dict, float, float]:
    """``n`` task processes at once; returns the complete manifest, the wall time seen from here and the CPU
    seconds the tasks used (user + system, start-up included)."""
    env = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1"}
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "halsift.launch.cli", "score", "--detector", spec, "--data",
                               str(data), "--out", str(out), "--batch-size", str(batch), "--device", "cpu",
                               "--no-progress", "--num-tasks", str(n), "--task-index", str(i)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(n)]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(p.stderr.read().decode()[-2000:])
    return json.loads((out / "_manifest.json").read_text()), time.perf_counter() - t0, _children_cpu() - cpu0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="1,2", help="task counts to compare")
    p.add_argument("--samples", type=int, default=384, help="samples (3 sentences each)")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=256)
    a = p.parse_args(argv)
    spec = "clip:arch=halsift-tiny,pretrained=random,seed=0"
    tmp = Path(tempfile.mkdtemp(prefix="halsift-bench-tasks-"))
    data = make_corpus(tmp / "data", a.samples, max(1, a.samples // a.shards), a.image_size)
    print(f"samples={a.samples} sentences={3 * a.samples} shards={len(list(data.glob('*.tar')))} "
          f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    start = startup_cpu(spec)
    print(f"start-up: {start:.1f} CPU s per process (imports + detector)")
    print(f"{'tasks':>5} {'sent/s':>9} {'wall s':>7} {'speed-up':>9} {'cpu s':>7} {'cores busy':>10} "
          f"{'sent/cpu-s':>10} {'after start-up':>14}")
    base = None
    for n in [int(x) for x in a.tasks.split(",")]:
        m, wall, cpu = run_tasks(spec, data, tmp / f"out-{n}", a.batch_size, n)
        base = base or m["sentences_per_s"]
        print(f"{n:>5} {m['sentences_per_s']:>9.1f} {wall:>7.1f} {m['sentences_per_s'] / base:>8.2f}x {cpu:>7.1f} "
              f"{cpu / wall:>10.2f} {m['sentences'] / cpu:>10.1f} {m['sentences'] / max(1e-9, cpu - n * start):>14.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
