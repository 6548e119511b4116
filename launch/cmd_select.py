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
    p.add_argument("--captioner", default="unknown",
                   help="captioner recorded for samples whose json has none (img2dataset output); default unknown")
    p.add_argument("--source", choices=("i2t", "t2i"), default="i2t",
                   help="source recorded for samples whose json has none; default i2t (the caption describes a "
                        "real image)")
    p.add_argument("--export-keys", metavar="PATH", default=None,
                   help="also write the kept source samples as a subset file: PATH.npy = DataComp uids (u8,u8, "
                        "sorted; from the json 'uid'), any other name = one key per line")
    p.add_argument("--detector", help="select from this detector's rows only (a score folder holds one detector; "
                                      "without this, a folder whose parts name another detector is refused)")
    p.add_argument("--allow-partial", action="store_true",
                   help="select from a score folder whose _manifest.json is not complete (recorded in the manifest)")
    p.add_argument("--maxcount", type=int, default=1000, help="samples per output shard")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--html", action="store_true",
                   help="also write OUT/index.html: a browser of the selected shards' captions, each sentence coloured "
                        "by its score and marked kept or dropped (thumbnails in OUT/samples/)")
    from halsift.launch.select_engines import add_resumable_arguments

    add_resumable_arguments(p)


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
    from halsift.launch.select_engines import run_resumable

    code = run_resumable(args)  # --resumable / --keys-only / --num-tasks; None: the in-memory select below
    if code is not None:
        return code

    try:
        m = select(args.scores, args.data, args.out, keep=args.keep, top_k=args.top_k, threshold=args.threshold,
                   unit=args.unit, agg=args.agg, per_captioner=args.per_captioner, random_baseline=args.random,
                   seed=args.seed, maxcount=args.maxcount, show_progress=not args.no_progress,
                   meta_defaults={"captioner": args.captioner, "source": args.source},
                   detector=args.detector, allow_partial=args.allow_partial)
    except SelectError as e:
        raise UsageError(str(e)) from e
    k = m["keys"]
    print(f"kept {m['kept_units']} of {m['candidates']} units ({m['samples_written']} samples written); "
          f"precision {m['precision']['input']} -> {m['precision']['kept']}; keys only in shards "
          f"{k['only_in_shards']}, only in scores {k['only_in_scores']}; {m['skipped']['total']} sample(s) "
          f"skipped -> {args.out}")
    from halsift.launch.run_wandb import log_select

    log_select(args, m)  # --wandb
    if args.export_keys:
        from halsift.corpus.subset import write_subset

        try:
            n = write_subset(args.export_keys, args.out)
        except ValueError as e:
            raise UsageError(f"--export-keys: {e}") from e
        print(f"wrote {n} {'uids' if args.export_keys.endswith('.npy') else 'keys'} -> {args.export_keys}")
    filled = m["meta_defaults"]["samples"]
    if filled:
        print("json fields missing in the data, defaults written: "
              + ", ".join(f"{f}={m['meta_defaults']['values'][f]!r} ({n} source samples)" for f, n in filled.items()))
    if args.html:
        from halsift.eval.html_report import write_select_html

        print(f"wrote {write_select_html(args.out, args.scores, args.data, m)}")
    return 0
