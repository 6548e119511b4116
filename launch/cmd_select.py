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
    """Run the selection ``cfg`` asks for (:class:`~halsift.filtering.selection.job.SelectJob`, the library call) and
    print its lines; returns the complete manifest, or ``None`` for a task of several that left the manifest to the
    last one."""
    from halsift.execution.claims import TaskError
    from halsift.execution.engines import run_job
    from halsift.filtering.selection.job import SelectJob
    from halsift.filtering.selection.select import SelectError
    from halsift.launch.cli import UsageError

    try:
        result = run_job(SelectJob(cfg))
    except (SelectError, TaskError) as e:
        raise UsageError(str(e)) from None
    print("\n".join(result.lines), flush=True)
    return result.stats if result.complete else None


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
