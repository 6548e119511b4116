"""``halsift score``: score every image–sentence pair of shards (or every row of a bench file) with a detector."""

from __future__ import annotations

import argparse

HELP = "score shards or a bench.jsonl with a detector spec (sharded over ranks, resumable)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--detector", required=True, metavar="SPEC",
                   help="detector spec or YAML file, e.g. clip:arch=ViT-B-32,pretrained=openai | random:seed=0 | oracle")
    p.add_argument("--data", required=True, help="shard folder / glob / brace pattern, or a bench.jsonl")
    p.add_argument("--out", required=True, help="output folder: parquet parts + _manifest.json")
    p.add_argument("--unit", choices=("sentence", "caption"), default="sentence",
                   help="score each sentence against its image (default) or the whole caption")
    p.add_argument("--batch-size", type=int, default=64, help="items per detector call")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: the process's accelerate device)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--decode-workers", type=int, default=0, metavar="N",
                   help="read, decode and preprocess in N processes per rank (detectors with a CPU half, e.g. "
                        "clip); 0: one read-ahead thread (default)")
    from halsift.launch.score_engines import add_task_arguments

    add_task_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from halsift.launch.cli import UsageError

    if args.batch_size < 1:
        raise UsageError(f"--batch-size: expected >= 1, got {args.batch_size}")
    if args.decode_workers < 0:
        raise UsageError(f"--decode-workers: expected >= 0, got {args.decode_workers}")
    if args.unit != "sentence" and str(args.data).endswith(".jsonl"):
        raise UsageError(f"--unit {args.unit}: a bench file ({args.data}) is scored per sentence (its rows); "
                         "use --unit sentence")
    from halsift.filtering.base import DetectorError
    from halsift.filtering.runner import MANIFEST, RunMismatch, score
    from halsift.launch.score_engines import run_tasks, summary

    code = run_tasks(args)  # --num-tasks / a SLURM array task / --engine ray; None: the rank-split run below
    if code is not None:
        return code
    try:
        out = score(args.detector, args.data, args.out, unit=args.unit, batch_size=args.batch_size,
                    device=args.device, show_progress=not args.no_progress, workers=args.decode_workers)
    except RunMismatch as e:
        raise UsageError(f"--out: {e}") from e
    except DetectorError as e:
        raise UsageError(f"--detector: {e}") from e
    from accelerate import PartialState

    if PartialState().is_main_process:
        summary(Path(out) / MANIFEST, args)
    return 0
