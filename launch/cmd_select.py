"""``halsift select``: keep the best-scored pairs (or captions) and write them as new shards."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from halsift.corpus.config import add_dataclass_arguments, config_from_args, field
from halsift.launch.describe import add_describe_argument
from halsift.launch.select_engines import SelectScaleConfig

HELP = "select the top fraction / top-k / above-threshold units by score and write new shards"


@dataclass
class SelectConfig:
    """``halsift select``'s settings (the resumable/parallel flags come from :mod:`halsift.launch.select_engines`)."""

    scores: str = field("", help="score folder written by `halsift score`", cli={"required": True})
    data: str = field("", help="the shards that were scored (folder / glob / brace pattern)", cli={"required": True})
    out: str = field("", help="new folder: shards + sizes.json + manifest.json + kept.parquet", cli={"required": True})
    keep: float | None = field(None, help="fraction of units to keep, e.g. 0.2",
                               cli={"exclusive": "amount", "required": True})
    top_k: int | None = field(None, help="number of units to keep", cli={"exclusive": "amount"})
    threshold: float | None = field(None, help="keep units scoring at least this (0-100)",
                                    cli={"exclusive": "amount"})
    unit: Literal["sentence", "caption"] = field("sentence", help="select image-sentence pairs (default) or whole "
                                                                  "captions")
    agg: Literal["min", "mean", "prob", "prune"] = field(
        "min", help="unit caption: aggregate sentence scores by min/mean/product of probabilities, or prune (drop "
                    "low sentences, keep the rest of the caption)")
    per_captioner: bool = field(False, help="apply --keep/--top-k within each captioner")
    random: bool = field(False, help="baseline: keep the same number of units at random")
    seed: int = field(0, help="seed of --random")
    captioner: str = field("unknown", help="captioner recorded for samples whose json has none (img2dataset "
                                           "output); default unknown")
    source: Literal["i2t", "t2i"] = field("i2t", help="source recorded for samples whose json has none; default i2t "
                                                      "(the caption describes a real image)")
    export_keys: str | None = field(None, help="also write the kept source samples as a subset file: PATH.npy = "
                                               "DataComp uids (u8,u8, sorted; from the json 'uid'), any other name "
                                               "= one key per line", cli={"metavar": "PATH"})
    detector: str | None = field(None, help="select from this detector's rows only (a score folder holds one "
                                            "detector; without this, a folder whose parts name another detector "
                                            "is refused)")
    allow_partial: bool = field(False, help="select from a score folder whose _manifest.json is not complete "
                                            "(recorded in the manifest)")
    maxcount: int = field(1000, help="samples per output shard")
    no_progress: bool = field(False, help="no progress bar")
    html: bool = field(False, help="also write OUT/index.html: a browser of the selected shards' captions, each "
                                   "sentence coloured by its score and marked kept or dropped (thumbnails in "
                                   "OUT/samples/)")

    def validate(self) -> None:
        from halsift.launch.recipe_config import check_selection

        check_selection("", self.keep, self.unit, self.agg, self.top_k, self.threshold)
        if self.maxcount < 1:
            raise ValueError(f"maxcount: expected >= 1, got {self.maxcount}")
        if self.agg != "min" and self.unit != "caption":
            raise ValueError(f"--agg {self.agg}: only used with --unit caption")


CONFIG = SelectConfig  # the settings (docs/config.md, --describe)
MORE_CONFIGS = (SelectScaleConfig,)  # its scale-out flags (launch/select_engines.py)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from halsift.launch.select_engines import add_resumable_arguments

    add_dataclass_arguments(p, SelectConfig, config_file=False, defaults=True)
    add_describe_argument(p, SelectConfig)
    add_resumable_arguments(p)


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError

    config_from_args(SelectConfig, args)  # the checks of SelectConfig.validate, errors naming the flag
    from halsift.filtering.selection.select import SelectError, select
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
    from halsift.launch.select_engines import summary_line

    print(f"{summary_line(m)} -> {args.out}")
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
        from halsift.eval.report.html import write_select_html

        print(f"wrote {write_select_html(args.out, args.scores, args.data, m)}")
    return 0
