"""``halsift score``: score every image–sentence pair of shards (or every row of a bench file) with a detector.

The settings (:class:`ScoreConfig`) become one :class:`~halsift.filtering.scoring.engine.ScoreJob`, run by the
engine ``--engine`` names (:mod:`halsift.filtering.scoring.engine`): the rank-split run (one process, or every rank
under ``halsift launch``), independent tasks (``--num-tasks``/``--task-index``, or a SLURM array task's
environment) or Ray (``--engine ray``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from halsift.corpus.config import add_dataclass_arguments, config_from_args
from halsift.filtering.scoring.config import ScoreConfig, job_of  # noqa: F401 (the command's settings and job)
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
    (:func:`~halsift.filtering.scoring.engine.resolve_engine`); one line and exit 2 for bad input."""
    from halsift.filtering.detectors.base import DetectorError
    from halsift.filtering.scoring.engine import EngineError, resolve_engine
    from halsift.filtering.scoring.parts import MANIFEST, RunMismatch
    from halsift.filtering.scoring.tasks import TaskError
    from halsift.launch.cli import UsageError

    from halsift.filtering.scoring.cascade import CascadeError, is_cascade, run_cascade

    job = job_of(cfg)
    try:
        if is_cascade(cfg.detector):  # a staged job: each stage an ordinary score run on the same engine
            result = run_cascade(job, cfg.engine)
        else:
            result = resolve_engine(cfg.engine, job).run(job)
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
