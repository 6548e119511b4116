"""``halsift score``: score every image–sentence pair of shards (or every row of a bench file) with a detector.

The settings (:class:`ScoreConfig`) become one :class:`~halsift.filtering.scoring.engine.ScoreJob`, run by the
engine ``--engine`` names (:mod:`halsift.filtering.scoring.engine`): the rank-split run (one process, or every rank
under ``halsift launch``), independent tasks (``--num-tasks``/``--task-index``, or a SLURM array task's
environment) or Ray (``--engine ray``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.units import Unit
from halsift.corpus.config import add_dataclass_arguments, config_from_args, field
from halsift.filtering.scoring.engine import EngineName
from halsift.launch.describe import add_describe_argument
from halsift.launch.run_wandb import WandbFlag, wandb_mode_field, wandb_project_field

_G = {"group": "scale-out (independent tasks, SLURM arrays, Ray)"}
HELP = "score shards or a bench.jsonl with a detector spec (sharded over ranks, resumable)"


@dataclass
class ScoreConfig:
    """``halsift score``'s settings: one class for its flags, ``--describe``, docs/config.md and the recipe's
    ``score:`` section (its ``unit``, ``batch_size`` and ``max_parse_failures``)."""

    detector: str = field("", help="detector spec or YAML file, e.g. clip:arch=ViT-B-32,pretrained=openai | "
                                   "random:seed=0 | oracle (`halsift score --describe`: the families' options)",
                          cli={"required": True, "metavar": "SPEC"})
    data: str = field("", help="shard folder / glob / brace pattern, or a bench.jsonl", cli={"required": True})
    out: str = field("", help="output folder: parquet parts + _manifest.json", cli={"required": True})
    unit: Unit = field("sentence", help="score each sentence against its image (default) "
                                                                  "or the whole caption")
    batch_size: int = field(64, help="items per detector call")
    device: str | None = field(None, help="cpu, cuda, cuda:1 ... (default: the process's accelerate device)")
    no_progress: bool = field(False, help="no progress bar")
    decode_workers: int = field(0, help="read, decode and preprocess in N processes per rank (detectors with a CPU "
                                        "half, e.g. clip); 0: one read-ahead thread (default). Use the cores per "
                                        "rank minus one: the model's process needs a core of its own. Honoured "
                                        "by every --engine; torch then runs on the cores left (unless "
                                        "OMP_NUM_THREADS is set)",
                                cli={"metavar": "N"})
    embeddings: str | None = field(None, help="a folder written by `halsift embed`: every CLIP-family detector of "
                                              "--detector reads its image and text vectors from it instead of "
                                              "encoding (the same model, else exit 2)", cli={"metavar": "DIR"})
    max_parse_failures: float = field(0.2, help="stop (exit 2) when more than this share of the scored items got no "
                                                "parsable answer (a judge's reply, scored 50): checked after 200 "
                                                "items and at the end; 1 turns the check off",
                                      cli={"metavar": "FRACTION"})
    # scale-out: the task / Ray engines that replace the rank-split run
    num_tasks: int | None = field(None, help="run as one of N independent tasks sharing --out (default: "
                                             "$SLURM_ARRAY_TASK_COUNT in an array job); the last task to finish "
                                             "writes the complete manifest", cli={**_G, "metavar": "N"})
    task_index: int | None = field(None, help="this task's index, 0..N-1 (default: $SLURM_ARRAY_TASK_ID - "
                                              "$SLURM_ARRAY_TASK_MIN)", cli={**_G, "metavar": "I"})
    claim_timeout: float | None = field(None, help="take over a part whose claim has had no heartbeat for S seconds "
                                                   "(a dead node; default 600)", cli={**_G, "metavar": "S"})
    engine: EngineName = field("local", help="local: this process, or every rank under `halsift launch` (tasks when "
                                             "--num-tasks or a SLURM array task's environment is given); tasks: one "
                                             "of --num-tasks independent tasks; ray: score the parts on a Ray "
                                             "cluster, one actor per GPU, parts dealt as actors free up (pip install "
                                             "'halsift[ray]')", cli=_G)
    address: str | None = field(None, help="--engine ray: the cluster to join, e.g. auto or ray://head:10001 "
                                           "(default: a local one)", cli=_G)
    workers: int | None = field(None, help="--engine ray: number of scoring actors (default: one per GPU of the "
                                           "cluster, else per CPU)", cli=_G)
    # logging: once the folder is complete (launch/run_wandb.py)
    wandb: WandbFlag | None = wandb_mode_field()
    wandb_project: str = wandb_project_field()

    def validate(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, got {self.batch_size}")
        if self.decode_workers < 0:
            raise ValueError(f"decode_workers: expected >= 0, got {self.decode_workers}")
        if not 0.0 <= self.max_parse_failures <= 1.0:
            raise ValueError(f"max_parse_failures: expected a fraction between 0 and 1, got {self.max_parse_failures}")
        if self.unit != "sentence" and str(self.data).endswith(".jsonl"):
            raise ValueError(f"--unit {self.unit}: a bench file ({self.data}) is scored per sentence (its rows); "
                             "use --unit sentence")


CONFIG = ScoreConfig  # the settings (docs/config.md, --describe)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(p, ScoreConfig, config_file=False, defaults=True)
    add_describe_argument(p, ScoreConfig, detectors=True)


def job_of(cfg: ScoreConfig):
    """The engine's job, built once from the settings (library code never sees argv)."""
    from halsift.filtering.scoring.engine import ScoreJob

    return ScoreJob(detector=cfg.detector, data=cfg.data, out=cfg.out, unit=cfg.unit, batch_size=cfg.batch_size,
                    device=cfg.device, decode_workers=cfg.decode_workers, max_parse_failures=cfg.max_parse_failures,
                    show_progress=not cfg.no_progress, num_tasks=cfg.num_tasks, task_index=cfg.task_index,
                    claim_timeout=cfg.claim_timeout, address=cfg.address, workers=cfg.workers,
                    embeddings=cfg.embeddings)


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
