"""``halsift embed``: image, whole-caption and per-sentence embeddings of every shard, once, for every CLIP-family
filter to read (``halsift score --embeddings DIR``, ``clip:...,embeddings=DIR``). Layout:
:mod:`halsift.corpus.embedding_store`; the run: :mod:`halsift.filtering.scoring.embed`, on the engine ``--engine``
names (:mod:`halsift.filtering.scoring.engine`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from halsift.corpus.config import add_dataclass_arguments, config_from_args, field
from halsift.filtering.scoring.stage import StageFlags
from halsift.launch.describe import add_describe_argument

HELP = "embed images and captions (whole and per sentence) of shards once, for CLIP-family filters (resumable)"


@dataclass
class EmbedConfig(StageFlags):
    """``halsift embed``'s settings (its flags, ``--describe`` and docs/config.md)."""

    model: str = field("", help="a CLIP-family detector spec, e.g. clip:arch=ViT-B-32,pretrained=openai (its "
                                "arch, weights, seed and fast_decode decide the vectors)",
                       cli={"required": True, "metavar": "SPEC"})
    data: str = field("", help="shard folder / glob / brace pattern", cli={"required": True})
    out: str = field("", help="output folder: one parquet part per shard + _manifest.json", cli={"required": True})
    batch_size: int = field(64, range="[1, inf)",
                            help="texts per model call (a sample's image, caption and sentences stay together)")
    device: str | None = field(None, help="cpu, cuda, cuda:1 ... (default: the process's accelerate device)")
    no_progress: bool = field(False, help="no progress bar")


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
                   claim_timeout=cfg.claim_timeout, address=cfg.address, workers=cfg.workers,
                   decode_workers=cfg.decode_workers)
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
