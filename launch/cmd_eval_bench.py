"""``halsift eval bench``: the AlignBench / HalDec-Bench sentence-level detection evaluation."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

HELP = "evaluate detectors on an annotated bench: AUROC with CIs, localization, ensembles, report and plots"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bench", required=True, help="bench.jsonl (one annotated sentence per row)")
    p.add_argument("--scores", nargs="+", action="extend", default=[], metavar="DIR",
                   help="score folder(s) or parquet file(s) of the bench (key = row id, sentence_index = position); "
                        "a folder holding several detectors is split by its 'detector' column")
    p.add_argument("--detector", nargs="+", action="extend", default=[], metavar="SPEC",
                   help="detector spec(s) to score the bench with first (scores go to OUT/scores/<name>)")
    p.add_argument("--out", required=True, help="output folder for metrics.json, report.md and plots/")
    p.add_argument("--keep", type=float, default=0.2, help="share kept for precision@keep (HalDec Fig. 8)")
    p.add_argument("--self-preference", nargs="+", action="extend", default=[], metavar="DET=GEN",
                   help="detector=generator pairs: the generator that is the detector's own model (Fig. 8)")
    p.add_argument("--ensemble", nargs="+", action="extend", default=[], metavar="A+B",
                   help="ensembles to report: detector names joined by '+' (mean of their scores, Table 6)")
    p.add_argument("--likelihood", metavar="SPEC",
                   help="vlm detector spec: add the likelihood analysis (HalDec Fig. 7), each sentence's "
                        "log-likelihood given its own vs a random image, by position and label "
                        "(likelihood/... metrics, a report table, plots/likelihood.png, likelihood.csv)")
    p.add_argument("--likelihood-images", type=int, default=None, metavar="N",
                   help="--likelihood: only the rows of N images (a sample seeded by --seed; default: all)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates for the 95%% CIs")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-html", action="store_true",
                   help="skip index.html (the report with a browser of the bench's captions, opened from disk)")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "detector"


def _load_scores(paths: list[str]) -> dict:
    from halsift.corpus.scores import read_scores_df
    from halsift.launch.cli import UsageError

    out = {}
    for path in paths:
        df = read_scores_df(path)
        names = sorted(df["detector"].dropna().unique()) if "detector" in df.columns else []
        groups = [(n, df[df["detector"] == n]) for n in names] if len(names) > 1 else \
            [(names[0] if names else Path(path).stem, df)]
        for name, part in groups:
            if name in out:
                raise UsageError(f"--scores {path}: detector {name!r} appears in more than one score folder")
            out[name] = part.reset_index(drop=True)
    return out


def _score_with_detectors(specs: list[str], bench: str, out_dir: Path) -> dict:
    import pandas as pd

    from halsift.corpus.scores import read_scores_df
    from halsift.filtering.runner import score_bench
    from halsift.filtering.spec import load_detector

    out = {}
    for spec in specs:
        detector = load_detector(spec)
        name = str(getattr(detector, "name", spec))
        folder = out_dir / "scores" / _safe(name)
        result = score_bench(detector, bench, folder)
        out[name] = result if isinstance(result, pd.DataFrame) else read_scores_df(
            result if isinstance(result, (str, Path)) else folder)
    return out


def _likelihood(spec: str, bench: str, out_dir: Path, seed: int, max_images: int | None):
    from halsift.corpus.atomic import write_text_atomic
    from halsift.eval.likelihood import likelihood_table
    from halsift.filtering.spec import load_detector
    from halsift.launch.cli import UsageError

    judge = load_detector(spec).vlm_judge("--likelihood")  # MissingCapability: one line, exit 2
    try:
        table = likelihood_table(judge, bench, seed=seed, max_images=max_images)
    except ValueError as e:
        raise UsageError(f"--likelihood: {e}") from e
    write_text_atomic(out_dir / "likelihood.csv", table.to_csv(index=False))
    return table


def run(args: argparse.Namespace) -> int:
    from halsift.eval.agreement import AgreementError
    from halsift.eval.bench_eval import evaluate_bench
    from halsift.eval.detection import MetricError
    from halsift.launch.cli import UsageError

    if not args.scores and not args.detector:
        raise UsageError("--scores/--detector: give score folders (--scores DIR ...) or detector specs "
                         "(--detector SPEC ...) to evaluate")
    if not 0 < args.keep <= 1:
        raise UsageError(f"--keep: {args.keep} is not a share in (0, 1]")
    if args.n_boot < 10:
        raise UsageError(f"--n-boot: {args.n_boot}, expected at least 10")
    mapping = {}
    for pair in args.self_preference:
        det, sep, gen = pair.partition("=")
        if not sep or not det or not gen:
            raise UsageError(f"--self-preference: {pair!r} is not DETECTOR=GENERATOR")
        mapping[det] = gen
    if not Path(args.bench).exists():
        raise FileNotFoundError(f"--bench: {args.bench} does not exist")
    if args.likelihood_images is not None and args.likelihood_images < 2:
        raise UsageError(f"--likelihood-images: {args.likelihood_images}, expected at least 2 (a random image "
                         "must differ from the own one)")
    if args.likelihood_images is not None and not args.likelihood:
        raise UsageError("--likelihood-images: needs --likelihood SPEC")
    out_dir = Path(args.out)
    scores = _load_scores(args.scores)
    if args.detector:
        for name, df in _score_with_detectors(args.detector, args.bench, out_dir).items():
            if name in scores:
                raise UsageError(f"--detector: {name!r} is also given by --scores")
            scores[name] = df
    likelihood = None
    if args.likelihood:
        likelihood = _likelihood(args.likelihood, args.bench, out_dir, args.seed, args.likelihood_images)
    try:
        metrics = evaluate_bench(args.bench, scores, out_dir, keep=args.keep, self_pref_map=mapping or None,
                                 ensembles=args.ensemble, n_boot=args.n_boot, seed=args.seed,
                                 plots=not args.no_plots, likelihood=likelihood, html=not args.no_html)
    except (MetricError, AgreementError) as e:
        raise UsageError(str(e)) from e
    several = len(scores) + len(args.ensemble) > 1
    for name in list(scores) + list(args.ensemble):
        key = f"{name}/auroc/mean" if several else "auroc/mean"
        lo, hi = (f"{name}/auroc_lo/mean", f"{name}/auroc_hi/mean") if several else ("auroc_lo/mean", "auroc_hi/mean")
        if key in metrics:
            print(f"{name}: AUROC mean {metrics[key]:.1f} [{metrics.get(lo, float('nan')):.1f}, "
                  f"{metrics.get(hi, float('nan')):.1f}]")
    html = "" if args.no_html else f" and {out_dir / 'index.html'}"
    print(f"wrote {out_dir / 'metrics.json'}, {out_dir / 'report.md'}{html}")
    return 0
