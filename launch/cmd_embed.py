"""``halsift embed``: image, whole-caption and per-sentence embeddings of every shard, once, for every CLIP-family
filter to read (``halsift score --embeddings DIR``, ``clip:...,embeddings=DIR``). Layout:
:mod:`halsift.corpus.embedding_store`; the run: :mod:`halsift.filtering.scoring.embed`, on the engine ``--engine``
names (:mod:`halsift.filtering.scoring.engine`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from halsift.corpus.config import add_dataclass_arguments, config_from_args, field
from halsift.launch.describe import add_describe_argument

_G = {"group": "scale-out (independent tasks, SLURM arrays)"}
HELP = "embed images and captions (whole and per sentence) of shards once, for CLIP-family filters (resumable)"


@dataclass
class EmbedConfig:
    """``halsift embed``'s settings (its flags, ``--describe`` and docs/config.md)."""

    model: str = field("", help="a CLIP-family detector spec, e.g. clip:arch=ViT-B-32,pretrained=openai (its "
                                "arch, weights, seed and fast_decode decide the vectors)",
                       cli={"required": True, "metavar": "SPEC"})
    data: str = field("", help="shard folder / glob / brace pattern", cli={"required": True})
    out: str = field("", help="output folder: one parquet part per shard + _manifest.json", cli={"required": True})
    batch_size: int = field(64, help="texts per model call (a sample's image, caption and sentences stay together)")
    device: str | None = field(None, help="cpu, cuda, cuda:1 ... (default: the process's accelerate device)")
    no_progress: bool = field(False, help="no progress bar")
    engine: Literal["local", "tasks", "ray"] = field("local", help="local: this process, or every rank under "
                                                            "`halsift launch` (tasks when --num-tasks or a SLURM array "
                                                            "task's environment is given); ray: the parts on a Ray "
                                                            "cluster (pip install 'halsift[ray]'); tasks: one of "
                                                            "--num-tasks "
                                                            "independent tasks", cli=_G)
    num_tasks: int | None = field(None, help="run as one of N independent tasks sharing --out (default: "
                                             "$SLURM_ARRAY_TASK_COUNT in an array job)", cli={**_G, "metavar": "N"})
    task_index: int | None = field(None, help="this task's index, 0..N-1 (default: $SLURM_ARRAY_TASK_ID - "
                                              "$SLURM_ARRAY_TASK_MIN)", cli={**_G, "metavar": "I"})
    claim_timeout: float | None = field(None, help="take over a part whose claim has had no heartbeat for S seconds "
                                                   "(a dead node; default 600)", cli={**_G, "metavar": "S"})
    address: str | None = field(None, help="--engine ray: the cluster to join, e.g. auto or ray://head:10001 "
                                           "(default: a local one)", cli=_G)
    workers: int | None = field(None, help="--engine ray: parts embedded at a time (default: the cluster's CPUs)",
                                cli=_G)

    def validate(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, got {self.batch_size}")


CONFIG = EmbedConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(p, EmbedConfig, config_file=False, defaults=True)
    add_describe_argument(p, EmbedConfig)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(EmbedConfig, args)
    from halsift.filtering.detectors.base import DetectorError
    from halsift.filtering.scoring.embed import EmbedJob
    from halsift.filtering.scoring.engine import resolve_engine
    from halsift.launch.cli import UsageError

    job = EmbedJob(model=cfg.model, data=cfg.data, out=cfg.out, batch_size=cfg.batch_size, device=cfg.device,
                   show_progress=not cfg.no_progress, num_tasks=cfg.num_tasks, task_index=cfg.task_index,
                   claim_timeout=cfg.claim_timeout, address=cfg.address, workers=cfg.workers)
    try:
        result = resolve_engine(cfg.engine, job).embed(job)
    except DetectorError as e:
        raise UsageError(f"--model: {e}") from e
    for line in result.lines:
        print(line, flush=True)
    m = result.stats
    if result.complete and result.report:
        print(f"embedded {m['samples']} samples ({m['images']} images, {m['texts']} texts, dim {m['dim']}) in "
              f"{m['parts']} parts ({m['parts_resumed']} reused); skipped {m['skipped']['total']} -> {cfg.out}",
              flush=True)
    return 0
