"""``halsift score``: score every image–sentence pair of shards (or every row of a bench file) with a detector.

The settings (:class:`ScoreConfig`) become one :class:`~halsift.filtering.scoring.job.ScoreJob`, run through the
execution layer's one door (:func:`halsift.execution.engines.run_job`, as ``halsift.score`` and a recipe run it) on
the engine ``--engine`` names: the rank-split run (one process, or every rank under ``halsift launch``), independent
tasks (``--num-tasks``/``--task-index``, or a SLURM array task's environment) or Ray (``--engine ray``); a cascade
spec runs as its staged pipeline on that engine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from halsift.corpus.config import add_dataclass_arguments, config_from_args
from halsift.filtering.scoring.config import ScoreConfig
from halsift.filtering.scoring.job import job_of  # noqa: F401 (the command's settings and job)
from halsift.launch.describe import add_describe_argument

HELP = "score shards or a bench.jsonl with a detector spec (sharded over ranks, resumable)"


CONFIG = ScoreConfig  # the settings (docs/config.md, --describe)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(p, ScoreConfig, config_file=False, defaults=True)
    add_describe_argument(p, ScoreConfig, detectors=True)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(ScoreConfig, args)  # typed and checked (ScoreConfig.validate), errors name the flag
    return run_config(cfg)


def run_config(cfg: ScoreConfig) -> int:
    """Run ``halsift score`` with settings ``cfg`` on the engine ``cfg.engine`` resolves to
    (:func:`~halsift.execution.engines.run_job`); one line and exit 2 for bad input."""
    from halsift.execution.claims import TaskError
    from halsift.execution.engines import EngineError, run_job
    from halsift.filtering.detectors.base import DetectorError
    from halsift.filtering.scoring.cascade import CascadeError
    from halsift.filtering.scoring.parts import MANIFEST, RunMismatch
    from halsift.launch.cli import UsageError

    try:
        result = run_job(job_of(cfg), cfg.engine)
    except (TaskError, EngineError, CascadeError) as e:
        raise UsageError(str(e)) from None
    except RunMismatch as e:
        raise UsageError(f"--out: {e}") from e
    except DetectorError as e:
        raise UsageError(f"--detector: {e}") from e
    for line in result.lines:
        print(line, flush=True)
    if result.complete and result.report:
        summary(Path(cfg.out) / MANIFEST, cfg)
    return 0


def summary(manifest: Path, cfg: ScoreConfig | None = None) -> None:
    """The one-line result of a finished score run (and its wandb run when ``cfg.wandb`` asks for one)."""
    m = json.loads(manifest.read_text())
    print(f"scored {m['sentences']} items of {m['samples']} samples in {m['parts']} parts "
          f"({m['sentences_per_s']} items/s this run); skipped {m['skipped']['total']}, "
          f"parse failures {m['parse_failures']} -> {manifest.parent}", flush=True)
    if cfg is not None:
        from halsift.launch.run_wandb import log_score

        log_score(cfg, manifest)
