"""``halsift select``: keep the best-scored pairs (or captions) and write them as new shards.

One select, two engines with the same checks, output-folder state and resumability
(:mod:`halsift.filtering.selection.guard`): in memory (:func:`halsift.filtering.selection.select.select`, ``--maxcount`` samples
per output shard) unless ``--resumable`` / ``--keys-only`` / ``--num-tasks`` / ``--memory-limit`` (or a SLURM
array's environment) ask for the out-of-core one (:func:`halsift.filtering.selection.resumable.select_resumable`, one output
shard per input shard). Each engine honours every flag or refuses it with one line.
"""

from __future__ import annotations

import argparse

from halsift.corpus.config import add_dataclass_arguments, config_from_args
# the settings and rules live with the selection (re-exported: the command's names)
from halsift.filtering.selection.config import SelectConfig, amount, check_guarantee, check_selection  # noqa: F401
from halsift.launch.describe import add_describe_argument

HELP = "select the top fraction / top-k / above-threshold units by score and write new shards"
CONFIG = SelectConfig  # the settings (docs/config.md, --describe)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(p, SelectConfig, config_file=False, defaults=True)
    add_describe_argument(p, SelectConfig)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(SelectConfig, args)  # the checks of SelectConfig.validate, errors naming the flag
    if cfg.export_keys and cfg.export_keys.endswith(".npy"):  # found before any shard or manifest is written
        from halsift.corpus.subset import check_uids_up_front
        from halsift.launch.cli import UsageError

        try:
            check_uids_up_front(cfg.data)
        except ValueError as e:
            raise UsageError(f"--export-keys: {e}") from None
    m = run_engine(cfg)
    if m is None:  # a task of several: the last one to finish writes the manifest and what follows from it
        return 0
    _after(cfg, m)
    return 0


def run_engine(cfg: SelectConfig) -> dict | None:
    """Run the selection ``cfg`` asks for and print its summary; returns the complete manifest, or ``None`` for a
    task of several that left the manifest to the last one."""
    from halsift.filtering.selection.select import SelectError, select
    from halsift.filtering.selection.out_of_core import MEMORY_LIMIT
    from halsift.filtering.selection.resumable import select_resumable
    from halsift.execution.claims import TaskError, task_from_env
    from halsift.launch.cli import UsageError
    from halsift.launch.select_engines import MAXCOUNT, engine_of, refusal, summary_line

    try:
        task = task_from_env(cfg.num_tasks, cfg.task_index)
    except TaskError as e:
        raise UsageError(str(e)) from None
    engine = engine_of(cfg, task)
    why = refusal(cfg, engine)
    if why:
        raise UsageError(why)
    guarantee = _plan_guarantee(cfg)
    how_much = amount(cfg.keep, cfg.top_k, guarantee[0].threshold if guarantee else cfg.threshold)
    common = dict(**how_much, unit=cfg.unit, agg=cfg.agg, seed=cfg.seed,
                  show_progress=not cfg.no_progress, meta_defaults={"captioner": cfg.captioner, "source": cfg.source},
                  detector=cfg.detector, allow_partial=cfg.allow_partial)
    n, i = task or (1, 0)
    try:
        from halsift.filtering.selection.compose import split_scores
        from halsift.launch.select_compose import composition_of

        named = split_scores(cfg.scores)  # [(NAME or None, DIR)], the first is ranked by default
        common["compose"] = composition_of(cfg, named)
        if engine == "memory":
            m = select(named[0][1], cfg.data, cfg.out, per_captioner=cfg.per_captioner, random_baseline=cfg.random,
                       maxcount=cfg.maxcount or MAXCOUNT, **common)
        else:
            res = select_resumable(named[0][1], cfg.data, cfg.out, keys_only=cfg.keys_only, num_tasks=n, task_index=i,
                                   memory_limit=cfg.memory_limit or MEMORY_LIMIT, **common)
            m = res.get("manifest")
    except SelectError as e:
        raise UsageError(str(e)) from None
    if m is not None and guarantee:
        from halsift.filtering.selection.guaranteed import guarantee_line, record_guarantee

        m = record_guarantee(cfg.out, m, *guarantee)
        print(guarantee_line(m), flush=True)
    if m is None:
        print(f"select task {i}/{n}: wrote {res['shards_written']} shards; {res['shards_missing']} not written "
              f"yet (other tasks hold them); the last task to finish writes {cfg.out}/manifest.json", flush=True)
    elif cfg.keys_only:
        print(f"kept {m['kept_units']} of {m['candidates']} units (threshold {m['threshold_used']}) -> "
              f"{cfg.out}/kept.parquet", flush=True)
    else:
        print(f"{summary_line(m)} -> {cfg.out}", flush=True)
    if m is not None and m.get("composition"):
        from halsift.launch.select_compose import composition_lines

        print("\n".join(composition_lines(m["composition"])), flush=True)
    return m


def _plan_guarantee(cfg: SelectConfig) -> tuple | None:
    """``(Guarantee, Calibration)`` when ``--max-hallucination`` is set (the certified threshold), else None."""
    if cfg.max_hallucination is None:
        return None
    from halsift.filtering.selection.guaranteed import plan_guarantee

    return plan_guarantee(cfg.primary_scores, cfg.calibration, cfg.max_hallucination, cfg.confidence, cfg.unit, cfg.agg,
                          cfg.detector, cfg.calibration_captioners, cfg.calibration_splits)


def _after(cfg: SelectConfig, m: dict) -> None:
    """What follows a complete selection, whichever engine made it: wandb, the subset file, the page."""
    from halsift.launch.cli import UsageError
    from halsift.launch.run_wandb import log_select

    log_select(cfg, m)  # --wandb
    if cfg.export_keys:
        from halsift.corpus.subset import write_subset

        try:
            n = write_subset(cfg.export_keys, cfg.out)
        except ValueError as e:
            raise UsageError(f"--export-keys: {e}") from e
        print(f"wrote {n} {'uids' if cfg.export_keys.endswith('.npy') else 'keys'} -> {cfg.export_keys}")
    filled = (m.get("meta_defaults") or {}).get("samples") or {}
    if filled:
        print("json fields missing in the data, defaults written: "
              + ", ".join(f"{f}={m['meta_defaults']['values'][f]!r} ({n} source samples)" for f, n in filled.items()))
    if cfg.html:
        from halsift.eval.report.html import write_select_html

        print(f"wrote {write_select_html(cfg.out, cfg.primary_scores, cfg.data, m)}")
