"""``halsift select --resumable``: out-of-core keys (DuckDB), a key list without resharding (``--keys-only``),
resharding that resumes per shard and is shared by ``--num-tasks`` processes (or a SLURM array's tasks)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from halsift.corpus.config import field


_G = {"group": "at scale (out-of-core, resumable, parallel)"}


@dataclass
class SelectScaleConfig:
    """``halsift select``'s at-scale settings (docs/config.md lists them with the command's)."""

    resumable: bool = field(False, help="out-of-core keys (DuckDB) and one output shard per input shard, each "
                                        "written once: a killed run reruns to the identical result (implied by the "
                                        "flags below)", cli=_G)
    keys_only: bool = field(False, help="write only kept.parquet (the kept key, sentence_index, score) and the "
                                        "manifest: no shards", cli=_G)
    num_tasks: int | None = field(None, help="reshard as one of N processes sharing --out (default: "
                                             "$SLURM_ARRAY_TASK_COUNT in an array)", cli={**_G, "metavar": "N"})
    task_index: int | None = field(None, help="this process's index, 0..N-1", cli={**_G, "metavar": "I"})
    memory_limit: str | None = field(None, help="DuckDB's memory limit for the keys, e.g. 1GB (default)", cli=_G)


def summary_line(m: dict) -> str:
    """One line on a select manifest: units kept, precision in -> kept (and of the sentences, for whole captions),
    keys found on one side only, skipped samples."""
    k, prec, sent = m["keys"], m["precision"], m.get("sentence_precision") or {}
    sentences = (f" (sentences {sent.get('input')} -> {sent.get('kept')})"
                 if sent and (sent.get("input"), sent.get("kept")) != (prec["input"], prec["kept"]) else "")
    skipped = m.get("skipped", {}).get("total")
    return (f"kept {m['kept_units']} of {m['candidates']} units ({m['samples_written']} samples written); "
            f"precision {prec['input']} -> {prec['kept']}{sentences}; keys only in shards {k['only_in_shards']}, "
            f"only in scores {k['only_in_scores']}" + (f"; {skipped} sample(s) skipped" if skipped is not None else ""))


def add_resumable_arguments(p: argparse.ArgumentParser) -> None:
    from halsift.corpus.config import add_dataclass_arguments
    from halsift.launch.run_wandb import add_wandb_arguments

    add_dataclass_arguments(p, SelectScaleConfig, config_file=False, defaults=True)
    add_wandb_arguments(p)  # --wandb [MODE], --wandb-project: one run per complete selection (run_wandb.log_select)


def run_resumable(args: argparse.Namespace) -> int | None:
    """Run the resumable select when asked for; ``None`` when the ordinary one applies."""
    from halsift.filtering.selection.select import SelectError
    from halsift.filtering.selection.out_of_core import MEMORY_LIMIT
    from halsift.filtering.selection.resumable import select_resumable
    from halsift.filtering.scoring.tasks import TaskError, task_from_env
    from halsift.launch.cli import UsageError

    try:
        task = task_from_env(args.num_tasks, args.task_index)
    except TaskError as e:
        raise UsageError(str(e)) from None
    if not (args.resumable or args.keys_only or task is not None or args.memory_limit):
        return None
    if args.per_captioner or args.random:
        raise UsageError(f"--resumable: not with {'--per-captioner' if args.per_captioner else '--random'}; "
                         "run select without --resumable/--keys-only/--num-tasks")
    n, i = task or (1, 0)
    try:
        run = select_resumable(args.scores, args.data, args.out, keep=args.keep, top_k=args.top_k,
                               threshold=args.threshold, unit=args.unit, agg=args.agg, seed=args.seed,
                               keys_only=args.keys_only, num_tasks=n, task_index=i,
                               memory_limit=args.memory_limit or MEMORY_LIMIT, show_progress=not args.no_progress,
                               allow_partial=bool(getattr(args, "allow_partial", False)),
                               detector=getattr(args, "detector", None),
                               meta_defaults={"captioner": args.captioner, "source": args.source})
    except SelectError as e:
        raise UsageError(str(e)) from None
    m = run.get("manifest")
    if m is None:
        print(f"select task {i}/{n}: wrote {run['shards_written']} shards; {run['shards_missing']} not written "
              f"yet (other tasks hold them); the last task to finish writes {args.out}/manifest.json", flush=True)
        return 0
    from halsift.launch.run_wandb import log_select

    if args.keys_only:
        log_select(args, m)
        print(f"kept {m['kept_units']} of {m['candidates']} units (threshold {m['threshold_used']}) -> "
              f"{args.out}/kept.parquet", flush=True)
        return 0
    print(f"{summary_line(m)} -> {args.out}", flush=True)
    log_select(args, m)
    return 0
