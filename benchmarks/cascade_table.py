"""The cascade on the quickstart's world protocol (issue 44): the judge on everything, the cheap stage alone and the
cascade at judge budgets 10 / 25 / 50 %, per world seed.

    python benchmarks/cascade_table.py --seeds 21 22 --finetune-seeds 2 --out runs/cascade_table   # the full table
    python benchmarks/cascade_table.py --seeds 21 --tiny --out /tmp/cascade_tiny                   # a smoke run

Runs ``recipes/quickstart.yaml`` per world seed (``benchmarks/table_f.py``'s :func:`run_seed`: finished stages are
reused) with three more detectors, ``cascade-B`` = ``cascade:cheap=[{trained.clip-lora}],judge=[{trained.judge}],
budget=B``, selected like every filter (top 20 % of captions by mean sentence score). Prints per world and filter:
kept precision, R@5 (mean over fine-tuning seeds), judge calls (units the judge scored, from the score manifests), the
corpus scoring's wall time (a cascade's: all its stages), and for each cascade R@5 minus the judge's with the 95 %
paired-bootstrap interval over the retrieval queries (``halsift.eval.report.compare.bootstrap_delta``). Checks the
issue's target per world: at <= 25 % of judge calls the cascade keeps >= 95 % of the judge's kept precision and the
interval of R@5 (cascade - judge) reaches 0 or above. Exit code 1 when a target fails.

``--tiny`` shrinks the world and every training run (a smoke test of the protocol, not a measurement). Wall times are
those the score manifests record, i.e. of each folder's last invocation: use a fresh ``--out`` for timings (a resumed
folder records seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from table_f import r5, run_seed  # noqa: E402

BUDGETS = (0.1, 0.25, 0.5)
CHEAP, JUDGE = "clip-lora", "judge"
TINY = ["world.images=240", "world.bench_images=30", "world.pretrain_images=200", "world.retrieval_images=30",
        "pretrain.steps=10", "finetune.steps=10", "detectors.judge.options.pretrain_steps=10",
        "detectors.judge.options.judge_steps=10", "detectors.clip-lora.options.steps=10", "evals={}"]


def cascade_overrides(budgets: tuple[float, ...]) -> list[str]:
    """One ``score.detectors`` entry per budget: the quickstart's clip-lora as the cheap stage, its judge as judge."""
    return [f"score.detectors.cascade-{round(100 * b)}=cascade:cheap=[{{trained.{CHEAP}}}],"
            f"judge=[{{trained.{JUDGE}}}],budget={b}" for b in budgets]


def scoring(run_dir: Path, name: str) -> tuple[int | None, float]:
    """(judge calls, wall seconds) of a filter's corpus scoring; the wall time sums every score run in its folder
    (a set-level ensemble's members, a cascade's stages)."""
    folder = run_dir / "score" / name / "corpus"
    m = json.loads((folder / "_manifest.json").read_text())
    wall = sum(json.loads(f.read_text()).get("wall_time_s", 0.0) for f in folder.rglob("_manifest.json"))
    if "cascade" in m:
        return m["cascade"]["judge_calls"], wall
    return (m["sentences"] if name == JUDGE else 0), wall


def paired_interval(run_dir: Path, a: str, b: str, seeds: int) -> tuple[float, float]:
    """95 % paired-bootstrap interval of R@5(a) - R@5(b) over the retrieval queries (NaN without ranks)."""
    from halsift.eval.report.compare import bootstrap_delta

    path = run_dir / "eval" / "retrieval_ranks.npz"
    if not path.exists():
        return float("nan"), float("nan")
    ranks = dict(np.load(path))
    retrieval = json.loads((run_dir / "eval" / "retrieval.json").read_text())
    sets = sorted({k.split("/")[0] for runs in retrieval.values() for run in runs for k in run})
    reps = bootstrap_delta(ranks, (a, seeds), (b, seeds), sets, 5, 1000, 0)
    if reps is None or not np.isfinite(reps).any():
        return float("nan"), float("nan")
    lo, hi = np.nanpercentile(reps, [2.5, 97.5])
    return float(lo), float(hi)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[21, 22], help="world seeds")
    ap.add_argument("--out", default="runs/cascade_table")
    ap.add_argument("--finetune-seeds", type=int, default=2, help="fine-tuning seeds per world (0..N-1)")
    ap.add_argument("--tiny", action="store_true", help="a shrunken world and training: a smoke run only")
    ap.add_argument("--set", nargs="*", default=[], dest="sets", help="more recipe overrides key=value")
    args = ap.parse_args(argv)
    sets = [*cascade_overrides(BUDGETS), f"finetune.seeds=[{','.join(map(str, range(args.finetune_seeds)))}]",
            *(TINY if args.tiny else []), *args.sets]
    out, ok = Path(args.out), True
    filters = [JUDGE, CHEAP, *(f"cascade-{round(100 * b)}" for b in BUDGETS)]
    for seed in args.seeds:
        metrics, _, _ = run_seed(seed, out, sets)
        run_dir = out / f"seed{seed}"
        units = json.loads((run_dir / "score" / CHEAP / "corpus" / "_manifest.json").read_text())["sentences"]
        print(f"\nworld seed {seed} ({units} corpus sentences, {args.finetune_seeds} fine-tuning seeds)")
        print("| filter | kept precision % | R@5 | judge calls | judge % | scoring wall s | R@5 - judge [95% CI] |")
        print("|---|---:|---:|---:|---:|---:|---|")
        judge_kp = metrics.get(f"{JUDGE}/kept_precision", float("nan"))
        for name in filters:
            calls, wall = scoring(run_dir, name)
            kp = metrics.get(f"{name}/kept_precision", float("nan"))
            lo, hi = paired_interval(run_dir, name, JUDGE, args.finetune_seeds) if name != JUDGE else (0.0, 0.0)
            diff = r5(metrics, name) - r5(metrics, JUDGE)
            print(f"| {name} | {kp:.1f} | {r5(metrics, name):.2f} | {calls} | {100 * calls / units:.1f} | {wall:.0f} "
                  f"| {diff:+.2f} [{lo:+.2f}, {hi:+.2f}] |")
            if name.startswith("cascade-") and calls <= 0.25 * units + 1:
                target = kp >= 0.95 * judge_kp and hi >= 0
                ok &= target
                print(f"  target ({name}: kept precision >= 95% of the judge's and CI reaching 0): "
                      f"{'met' if target else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
