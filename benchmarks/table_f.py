"""HalDec Table F in miniature, on several world seeds: does filtering with a better detector buy retrieval?

    python benchmarks/table_f.py --seeds 0 1 2                 # the quickstart on 3 worlds (~10 CPU min each)
    python benchmarks/table_f.py --seeds 0 1 2 --sweep 0.1 0.4   # + keep-fraction sweep (oracle, trained detectors)
                                                                 #   and the unfiltered corpus (keep 1.0)

Runs ``recipes/quickstart.yaml`` once per world seed (``seed=S``, ``run_dir=OUT/seedS``; finished stages are
reused), then prints R@5 (mean of i2t and t2i) per filter and seed with mean ± std over seeds, each filter's kept
precision and bench AUROC, the wall time of every stage, and checks the claims the quickstart makes:

* no-tune < random < oracle, with oracle - random >= 3 R@5 points, on every seed;
* the best trained detector (judge or clip-lora) beats random on every seed;
* Spearman correlation between kept precision and R@5 across filters >= 0.6 on every seed.

``--set key=value`` passes recipe overrides (e.g. ``finetune.seeds=[0]``). Exit code 1 when a claim fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

TRAINED = ("judge", "clip-lora")


def r5(metrics: dict, name: str) -> float:
    """R@5 of a filter as the report states it (``<filter>/r@5``: mean over retrieval sets and both directions)."""
    return metrics.get(f"{name}/r@5", float("nan"))


def sweep_overrides(keeps: list[float]) -> list[str]:
    """``select.variants`` for the oracle and the trained detectors at each keep, and the unfiltered corpus."""
    if not keeps:
        return []
    items = [f"{f}@{k}: {{filter: {f}, keep: {k}}}" for f in ("oracle", *TRAINED) for k in keeps]
    return ["select.variants={" + ", ".join(items) + "}", "finetune.unfiltered=true"]


def run_seed(seed: int, out: Path, sets: list[str]) -> tuple[dict, dict]:
    """Run (or resume) the quickstart on world ``seed``; returns its report metrics and stage wall times."""
    from halsift.launch.recipe import run_recipe
    from halsift.launch.cmd_run import load_recipe

    run_dir = out / f"seed{seed}"
    r = load_recipe("quickstart", [f"seed={seed}", f"run_dir={run_dir}", *sets])
    report = run_recipe(r)
    metrics = json.loads((report / "metrics.json").read_text())
    walls = {}
    for stage in r.stages:
        done = run_dir / stage / "_done.json"
        if done.exists():
            walls[stage] = json.loads(done.read_text()).get("wall_s", float("nan"))
    return metrics, walls


def checks(m: dict) -> dict[str, bool]:
    """The quickstart's claims on one seed's metrics."""
    no_tune, rnd, oracle = r5(m, "no-tune"), r5(m, "random"), r5(m, "oracle")
    best = max(r5(m, t) for t in TRAINED)
    rho = m.get("spearman/kept_precision_vs_r@5", float("nan"))
    return {"no-tune < random < oracle": no_tune < rnd < oracle, "oracle - random >= 3": oracle - rnd >= 3,
            "best trained detector > random": best > rnd, "spearman(kept precision, R@5) >= 0.6": rho >= 0.6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="world seeds")
    ap.add_argument("--out", default="runs/table_f")
    ap.add_argument("--sweep", type=float, nargs="*", default=[], help="extra keep fractions (e.g. 0.1 0.4)")
    ap.add_argument("--set", nargs="*", default=[], dest="sets", help="recipe overrides key=value")
    args = ap.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    out = Path(args.out)
    sets = [*sweep_overrides(args.sweep), *args.sets]
    per_seed, walls = {}, {}
    for s in args.seeds:
        t0 = time.time()
        per_seed[s], walls[s] = run_seed(s, out, sets)
        print(f"world seed {s}: {time.time() - t0:.0f}s this call", flush=True)

    names = sorted({k.removesuffix("/seeds") for m in per_seed.values() for k in m if k.endswith("/seeds")},
                   key=lambda n: (n != "no-tune", -statistics.mean(r5(m, n) for m in per_seed.values())))
    print("\nR@5 (mean of i2t and t2i) per world seed; kept precision and bench AUROC (mean over seeds)\n")
    print(f"| filter | {' | '.join(f'seed {s}' for s in args.seeds)} | mean ± std | kept precision | AUROC |")
    print("|---|" + "---:|" * (len(args.seeds) + 3))
    for n in names:
        vals = [r5(per_seed[s], n) for s in args.seeds]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        prec = [per_seed[s].get(f"{n}/kept_precision") for s in args.seeds]
        auc = [per_seed[s].get(f"{n}/auroc/mean") for s in args.seeds]
        fmt = (lambda xs: f"{statistics.mean(xs):.1f}" if all(x is not None for x in xs) else "–")
        print(f"| {n} | {' | '.join(f'{v:.1f}' for v in vals)} | {statistics.mean(vals):.1f} ± {sd:.1f} | "
              f"{fmt(prec)} | {fmt(auc)} |")
    print("\nstage wall time (s)\n")
    stages = list(next(iter(walls.values())))
    print(f"| seed | {' | '.join(stages)} | total |")
    print("|---|" + "---:|" * (len(stages) + 1))
    for s in args.seeds:
        w = walls[s]
        cells = " | ".join(f"{w[st]:.0f}" if st in w else "–" for st in stages)
        print(f"| {s} | {cells} | {sum(w.values()):.0f} |")
    print("\nclaims (every seed must hold)\n")
    ok = True
    for claim in checks(next(iter(per_seed.values()))):
        held = [checks(per_seed[s])[claim] for s in args.seeds]
        ok &= all(held)
        print(f"{'PASS' if all(held) else 'FAIL'}  {claim}  ({sum(held)}/{len(held)} seeds)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
