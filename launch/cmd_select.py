"""``halsift select``: keep the best-scored pairs (or captions) and write them as new shards."""

from __future__ import annotations

import argparse

HELP = "select the top fraction / top-k / above-threshold units by score and write new shards"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scores", required=True, help="score folder written by `halsift score`")
    p.add_argument("--data", required=True, help="the shards that were scored (folder / glob / brace pattern)")
    p.add_argument("--out", required=True, help="new folder: shards + sizes.json + manifest.json + kept.parquet")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--keep", type=float, help="fraction of units to keep, e.g. 0.2")
    how.add_argument("--top-k", type=int, help="number of units to keep")
    how.add_argument("--threshold", type=float, help="keep units scoring at least this (0-100)")
    p.add_argument("--unit", choices=("sentence", "caption"), default="sentence",
                   help="select image-sentence pairs (default) or whole captions")
    p.add_argument("--agg", choices=("min", "mean", "prob", "prune"), default="min",
                   help="unit caption: aggregate sentence scores by min/mean/product of probabilities, "
                        "or prune (drop low sentences, keep the rest of the caption)")
    p.add_argument("--per-captioner", action="store_true", help="apply --keep/--top-k within each captioner")
    p.add_argument("--random", action="store_true", help="baseline: keep the same number of units at random")
    p.add_argument("--seed", type=int, default=0, help="seed of --random")
    p.add_argument("--detector", help="select from this detector's rows only (a score folder holds one detector; "
                                      "without this, a folder whose parts name another detector is refused)")
    p.add_argument("--allow-partial", action="store_true",
                   help="select from a score folder whose _manifest.json is not complete (recorded in the manifest)")
    p.add_argument("--maxcount", type=int, default=1000, help="samples per output shard")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError

    if args.keep is not None and not 0 < args.keep <= 1:
        raise UsageError(f"--keep: expected a fraction in (0, 1], got {args.keep}")
    if args.top_k is not None and args.top_k < 0:
        raise UsageError(f"--top-k: expected >= 0, got {args.top_k}")
    if args.threshold is not None and not 0 <= args.threshold <= 100:  # also refuses nan
        raise UsageError(f"--threshold: expected a score in [0, 100], got {args.threshold}")
    if args.maxcount < 1:
        raise UsageError(f"--maxcount: expected >= 1, got {args.maxcount}")
    if args.agg != "min" and args.unit != "caption":
        raise UsageError(f"--agg {args.agg}: only used with --unit caption")
    from halsift.filtering.select import SelectError, select

    try:
        m = select(args.scores, args.data, args.out, keep=args.keep, top_k=args.top_k, threshold=args.threshold,
                   unit=args.unit, agg=args.agg, per_captioner=args.per_captioner, random_baseline=args.random,
                   seed=args.seed, maxcount=args.maxcount, show_progress=not args.no_progress,
                   detector=args.detector, allow_partial=args.allow_partial)
    except SelectError as e:
        raise UsageError(str(e)) from e
    k = m["keys"]
    print(f"kept {m['kept_units']} of {m['candidates']} units ({m['samples_written']} samples written); "
          f"precision {m['precision']['input']} -> {m['precision']['kept']}; keys only in shards "
          f"{k['only_in_shards']}, only in scores {k['only_in_scores']}; {m['skipped']['total']} sample(s) "
          f"skipped -> {args.out}")
    return 0
