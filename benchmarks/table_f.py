"""HalDec Table F in miniature, on several world seeds: does filtering with a better detector buy retrieval?

    python benchmarks/table_f.py --seeds 0 1 2                 # the quickstart on 3 worlds (~10 CPU min each)
    python benchmarks/table_f.py --seeds 0 1 2 --sweep 0.1 0.4   # + keep-fraction sweep (oracle, trained detectors)
                                                                 #   and the unfiltered corpus (keep 1.0)
    python benchmarks/table_f.py --seeds 0 1 2 3 4 --finetune-seeds 2   # 5 worlds x 2 fine-tuning seeds

Runs ``recipes/quickstart.yaml`` once per world seed (``seed=S``, ``run_dir=OUT/seedS``; finished stages are
reused), then prints R@5 (mean of i2t and t2i) per filter and world (mean over fine-tuning seeds) with mean ± std
over worlds x fine-tuning seeds, each filter's kept precision and bench AUROC, zero-shot top-1 (mean over the world's
tasks) and compositional (SugarCrepe) accuracy, the wall time of every stage, and checks the claims the quickstart
makes on every world x fine-tuning seed, each with its margin's spread (mean ± std, min):

* no-tune < random < oracle, with oracle - random >= 3 R@5 points;
* the best trained detector (judge or clip-lora) beats random;
* Spearman correlation between kept precision and R@5 across filters >= 0.6;
* per world, the best trained detector beats random as the report reads it: the 95% interval of the difference
  (over fine-tuning seeds and retrieval queries with >= 2 seeds, else over the queries only) lies above 0.

It also prints, per world, every filter's difference to random and to no-tune with the query-only interval and the
report's, marking where the conclusion (above 0 / includes 0 / below 0) changed, and the pooled seed spread of R@5
(the report's one-seed answer states it: ``eval/report/seed_spread.SEED_SD``).

The same margins on zero-shot top-1 and compositional accuracy (oracle and the best trained detector vs random) are
printed as findings, not claims.

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


def run_seed(seed: int, out: Path, sets: list[str]) -> tuple[dict, dict, list[dict]]:
    """Run (or resume) the quickstart on world ``seed``; returns its report metrics, stage wall times and one
    metrics dict per fine-tuning seed (:func:`per_finetune_seed`)."""
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
    return metrics, walls, per_finetune_seed(run_dir, metrics)


def per_finetune_seed(run_dir: Path, metrics: dict) -> list[dict]:
    """One metrics dict per fine-tuning seed, in the report's keys: ``<filter>/r@5`` of that seed's model (no-tune:
    the base model, the same for every seed), ``<filter>/zeroshot/acc1``, ``<filter>/compositional/mean``, the
    Spearman correlation of kept precision and that seed's R@5; kept precision and AUROC from the report."""
    from halsift.eval.report.compare import kept_precision_spearman, run_recall

    retrieval = json.loads((run_dir / "eval" / "retrieval.json").read_text())
    beyond_file = run_dir / "eval" / "beyond.json"
    beyond = json.loads(beyond_file.read_text()) if beyond_file.exists() else {}
    sets = sorted({k.split("/")[0] for runs in retrieval.values() for run in runs for k in run})
    n = max(len(runs) for runs in retrieval.values())
    out = []
    for i in range(n):
        m = {k: v for k, v in metrics.items() if k.endswith(("/kept_precision", "/auroc/mean", "/seeds"))}
        for name, runs in retrieval.items():
            run = runs[min(i, len(runs) - 1)]
            m[f"{name}/r@5"] = run_recall(run, sets, 5)
            b = beyond.get(name, [])
            for key in ("zeroshot/acc1", "compositional/mean"):
                if b and key in b[min(i, len(b) - 1)]:
                    m[f"{name}/{key}"] = b[min(i, len(b) - 1)][key]
        rows = [{"filter": name, "r@5": m[f"{name}/r@5"], "variant": "@" in name,
                 "kept_precision": metrics.get(f"{name}/kept_precision", float("nan"))} for name in retrieval]
        m["spearman/kept_precision_vs_r@5"] = kept_precision_spearman(rows, 5)[0]
        out.append(m)
    return out


def checks(m: dict) -> dict[str, bool]:
    """The quickstart's claims on one seed's metrics."""
    return {claim: held for claim, (held, _) in claim_margins(m).items()}


def claim_margins(m: dict) -> dict[str, tuple[bool, float]]:
    """Each claim on one world x fine-tuning seed: (held, its margin: how far it clears its bar, < 0 when not)."""
    no_tune, rnd, oracle = r5(m, "no-tune"), r5(m, "random"), r5(m, "oracle")
    best = max(r5(m, t) for t in TRAINED)
    rho = m.get("spearman/kept_precision_vs_r@5", float("nan"))
    return {"no-tune < random < oracle": (no_tune < rnd < oracle, min(rnd - no_tune, oracle - rnd)),
            "oracle - random >= 3": (oracle - rnd >= 3, oracle - rnd - 3),
            "best trained detector > random": (best > rnd, best - rnd),
            "spearman(kept precision, R@5) >= 0.6": (rho >= 0.6, rho - 0.6)}


def conclusion(lo: float, hi: float) -> str:
    """What an interval of a difference says: ``above 0``, ``below 0``, ``includes 0`` (``–`` without one)."""
    if not (lo == lo and hi == hi):
        return "–"
    return "above 0" if lo > 0 else "below 0" if hi < 0 else "includes 0"


def interval_changes(metrics: dict) -> list[dict]:
    """Per filter and reference (random, no-tune) of one world's report: the difference, its query interval
    (``ci_low``/``ci_high``), the interval the report's answer reads (over seeds and queries with >= 2 seeds:
    :func:`halsift.eval.report.compare.metrics_interval`), what each concludes and whether that changed."""
    from halsift.eval.report.compare import REFERENCES, metrics_interval

    names = sorted({k.removesuffix("/seeds") for k in metrics if k.endswith("/seeds")})
    out = []
    for ref, tag in REFERENCES:
        for n in names:
            if n == ref or f"{n}/{tag}/r@5" not in metrics:
                continue
            q = (metrics.get(f"{n}/{tag}/ci_low", float("nan")), metrics.get(f"{n}/{tag}/ci_high", float("nan")))
            lo, hi, kind = metrics_interval(metrics, n, tag)
            out.append({"filter": n, "reference": ref, "delta": metrics[f"{n}/{tag}/r@5"], "queries": q,
                        "read": (lo, hi), "kind": kind, "changed": conclusion(*q) != conclusion(lo, hi)})
    return out


def best_trained_interval(metrics: dict) -> tuple[str, float, float, str]:
    """The best trained detector of one world (by R@5) and its difference to random as the report's answer reads
    it: (name, low, high, kind)."""
    from halsift.eval.report.compare import metrics_interval

    best = max(TRAINED, key=lambda t: r5(metrics, t))
    return (best, *metrics_interval(metrics, best, "delta_random"))


def pooled_seed_sd(per_world: list[dict]) -> tuple[float, int]:
    """The std of one fine-tuned filter's R@5 between fine-tuning seeds, pooled over filters and worlds (each
    report's ``<filter>/r@5/seed<i>``; no-tune has no seeds), and its degrees of freedom."""
    ss, df = 0.0, 0
    for m in per_world:
        for n in {k.split("/r@5/seed")[0] for k in m if "/r@5/seed" in k} - {"no-tune"}:
            vals = [v for i in range(int(m.get(f"{n}/seeds", 0))) if (v := m.get(f"{n}/r@5/seed{i}")) is not None]
            if len(vals) > 1:
                ss += statistics.variance(vals) * (len(vals) - 1)
                df += len(vals) - 1
    return (ss / df) ** 0.5 if df else float("nan"), df


def findings(m: dict) -> dict[str, float]:
    """Gains over random beyond retrieval on one world x fine-tuning seed (points; NaN where not measured)."""
    out = {}
    for key, label in (("zeroshot/acc1", "zero-shot top-1"), ("compositional/mean", "compositional")):
        rnd = m.get(f"random/{key}", float("nan"))
        best = max((v for t in TRAINED if (v := m.get(f"{t}/{key}", float("nan"))) == v), default=float("nan"))
        out[f"oracle - random, {label}"] = m.get(f"oracle/{key}", float("nan")) - rnd
        out[f"best trained - random, {label}"] = best - rnd
    return out


def spread(values: list[float]) -> str:
    """'mean ± std (min x)' of finite values ('–' if none)."""
    vals = [v for v in values if v == v]
    if not vals:
        return "–"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.mean(vals):+.2f} ± {sd:.2f} (min {min(vals):+.2f})"


def print_intervals(per_seed: dict[int, dict]) -> bool:
    """Print the claim read as the report reads it, per world; every difference's query-only and report's interval
    with the conclusions that changed; the pooled seed spread. Returns whether the claim held on every world."""
    from halsift.eval.report.seed_spread import SEED_SD

    ok = True
    print("\nbest trained detector > random, read as the report reads it (95% interval over fine-tuning seeds and "
          "queries with >= 2 seeds, else over the queries only)\n")
    for s in per_seed:
        best, lo, hi, kind = best_trained_interval(per_seed[s])
        held, diff = lo > 0, r5(per_seed[s], best) - r5(per_seed[s], "random")
        ok &= held
        print(f"{'PASS' if held else 'FAIL'}  world {s}: {best} - random {diff:+.2f} [{lo:+.2f}, {hi:+.2f}] ({kind})")
    print("\ndifferences vs random and no-tune per world: 95% interval over the queries only -> as the report reads "
          "it (over seeds and queries with >= 2 seeds); * where the conclusion changed\n")
    print("| world | filter | vs | Δ R@5 | queries only | report's interval | conclusion |")
    print("|---|---|---|---:|---|---|---|")
    for s in per_seed:
        for c in interval_changes(per_seed[s]):
            (ql, qh), (lo, hi) = c["queries"], c["read"]
            print(f"| {s} | {c['filter']} | {c['reference']} | {c['delta']:+.2f} | [{ql:+.2f}, {qh:+.2f}] | "
                  f"[{lo:+.2f}, {hi:+.2f}] ({c['kind']}) | {conclusion(ql, qh)} -> {conclusion(lo, hi)}"
                  f"{' *' if c['changed'] else ''} |")
    sd, df = pooled_seed_sd(list(per_seed.values()))
    print(f"\nseed spread: std of one filter's R@5 between fine-tuning seeds, pooled over filters and worlds: {sd:.2f} "
          f"({df} degrees of freedom; the report's one-seed answer states SEED_SD = {SEED_SD}, "
          "eval/report/seed_spread.py)")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="world seeds")
    ap.add_argument("--out", default="runs/table_f")
    ap.add_argument("--sweep", type=float, nargs="*", default=[], help="extra keep fractions (e.g. 0.1 0.4)")
    ap.add_argument("--finetune-seeds", type=int, default=0,
                    help="fine-tuning seeds per world (0..N-1; default: the recipe's finetune.seeds)")
    ap.add_argument("--set", nargs="*", default=[], dest="sets", help="recipe overrides key=value")
    args = ap.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    out = Path(args.out)
    sets = [*sweep_overrides(args.sweep), *args.sets]
    if args.finetune_seeds:
        sets.append(f"finetune.seeds=[{', '.join(str(i) for i in range(args.finetune_seeds))}]")
    per_seed, walls, per_ft = {}, {}, {}
    for s in args.seeds:
        t0 = time.time()
        per_seed[s], walls[s], per_ft[s] = run_seed(s, out, sets)
        print(f"world seed {s}: {time.time() - t0:.0f}s this call", flush=True)
    grid = [m for s in args.seeds for m in per_ft[s]]  # every world x fine-tuning seed

    names = sorted({k.removesuffix("/seeds") for m in per_seed.values() for k in m if k.endswith("/seeds")},
                   key=lambda n: (n != "no-tune", -statistics.mean(r5(m, n) for m in per_seed.values())))
    n_ft = len(grid) // len(args.seeds)
    print(f"\nR@5 (mean of i2t and t2i) per world seed (mean over {n_ft} fine-tuning seed{'s' * (n_ft != 1)}), "
          f"mean ± std over the {len(grid)} worlds x fine-tuning seeds; kept precision and bench AUROC (mean over "
          "worlds); zero-shot top-1 and compositional accuracy (mean ± std over worlds x fine-tuning seeds)\n")
    print(f"| filter | {' | '.join(f'seed {s}' for s in args.seeds)} | mean ± std | kept precision | AUROC | "
          "zero-shot top-1 | compositional |")
    print("|---|" + "---:|" * (len(args.seeds) + 5))

    def mean_sd(xs: list) -> str:
        xs = [x for x in xs if x is not None and x == x]
        if not xs:
            return "–"
        return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.1f}"

    for n in names:
        vals = [r5(per_seed[s], n) for s in args.seeds]
        prec = [per_seed[s].get(f"{n}/kept_precision") for s in args.seeds]
        auc = [per_seed[s].get(f"{n}/auroc/mean") for s in args.seeds]
        fmt = (lambda xs: f"{statistics.mean(xs):.1f}" if all(x is not None for x in xs) else "–")
        print(f"| {n} | {' | '.join(f'{v:.1f}' for v in vals)} | {mean_sd([r5(m, n) for m in grid])} | "
              f"{fmt(prec)} | {fmt(auc)} | {mean_sd([m.get(f'{n}/zeroshot/acc1') for m in grid])} | "
              f"{mean_sd([m.get(f'{n}/compositional/mean') for m in grid])} |")
    print("\nstage wall time (s)\n")
    stages = list(next(iter(walls.values())))
    print(f"| seed | {' | '.join(stages)} | total |")
    print("|---|" + "---:|" * (len(stages) + 1))
    for s in args.seeds:
        w = walls[s]
        cells = " | ".join(f"{w[st]:.0f}" if st in w else "–" for st in stages)
        print(f"| {s} | {cells} | {sum(w.values()):.0f} |")
    print("\nclaims (every world x fine-tuning seed must hold; margin over the bar: mean ± std (min))\n")
    ok = True
    for claim in claim_margins(grid[0]):
        held = [claim_margins(m)[claim][0] for m in grid]
        ok &= all(held)
        print(f"{'PASS' if all(held) else 'FAIL'}  {claim}  ({sum(held)}/{len(held)} worlds x seeds; margin "
              f"{spread([claim_margins(m)[claim][1] for m in grid])})")
    ok &= print_intervals(per_seed)
    print("\nbeyond retrieval (findings, not claims): gain over random in points, mean ± std (min) over worlds x "
          "seeds\n")
    for name in findings(grid[0]):
        print(f"{name}: {spread([findings(m)[name] for m in grid])}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
