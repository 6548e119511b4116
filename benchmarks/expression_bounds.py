"""Bounded work of ``select --where`` (issue 41): time and peak memory of a composed selection as the number of
``and`` clauses grows up to the limit (``MAX_CLAUSES``), and of the expressions refused past the limits (3,000
clauses, 5,000 unary minuses, 5,000 terms), each in a fresh process so that peak RSS is its own.

    python benchmarks/expression_bounds.py                 # 24 x 4 samples, clauses 4 16 64 256 + refusals
    python benchmarks/expression_bounds.py --samples 2000  # a larger corpus

Prints one JSON line per case (clauses, exit code, seconds, peak RSS in MB); never passes or fails on time. The
issue's bar: a 3,000-clause expression runs in under 1 GB and 10 s or is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import resource, sys, time
from halsift.launch.cli import main
t = time.perf_counter()
code = main(sys.argv[1:])
print("RESULT", code, round(time.perf_counter() - t, 3), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _run(args: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT")), "RESULT ? ? ?")
    _, code, secs, rss = line.split()
    return {"exit": code, "seconds": secs, "peak_rss_mb": rss, "stderr": p.stderr.strip().splitlines()[-1:]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=96)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    from filtering_data import make_corpus

    from halsift.filtering.scoring.runner import score
    from halsift.filtering.selection.expression import MAX_CLAUSES

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        corpus = make_corpus(d / "corpus", shards=max(1, a.samples // 24), per_shard=min(24, a.samples))
        score("random:seed=1", corpus, d / "judge", show_progress=False)
        base = ["select", "--scores", f"judge={d / 'judge'}", "--data", str(corpus), "--keep", "1", "--no-progress"]
        cases = {f"{n} clauses": " and ".join(f"judge >= {i % 50}" for i in range(n))
                 for n in (4, 16, 64, MAX_CLAUSES)}
        cases["3000 clauses"] = " and ".join(f"judge > {i}" for i in range(3000))
        cases["3000 compact clauses"] = "and ".join("judge>1" for _ in range(3000))
        cases["5000 unary minuses"] = "-" * 5000 + "judge > 1"
        cases["5000 terms"] = "+".join(["judge"] * 5000) + " > 1"
        for i, (name, text) in enumerate(cases.items()):
            t = time.perf_counter()
            r = _run([*base, "--out", str(d / f"s{i}"), "--where", text])
            print(json.dumps({"case": name, **r, "wall_s": round(time.perf_counter() - t, 2)}), flush=True)


if __name__ == "__main__":
    main()
