"""``halsift embed``: image, whole-caption and per-sentence embeddings of every shard, once, for every CLIP-family
filter to read (``halsift score --embeddings DIR``, ``clip:...,embeddings=DIR``). Layout:
:mod:`halsift.corpus.embedding_store`; the job: :mod:`halsift.filtering.scoring.embed`, run through
:func:`halsift.execution.engines.run_job` on the engine ``--engine`` names."""

from __future__ import annotations

import argparse

from halsift.corpus.config import add_dataclass_arguments, config_from_args
from halsift.filtering.scoring.embed import EmbedConfig
from halsift.launch.describe import add_describe_argument

HELP = "embed images and captions (whole and per sentence) of shards once, for CLIP-family filters (resumable)"
CONFIG = EmbedConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(p, EmbedConfig, config_file=False, defaults=True)
    add_describe_argument(p, EmbedConfig)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(EmbedConfig, args)
    from halsift.execution.engines import run_job
    from halsift.filtering.detectors.base import DetectorError
    from halsift.filtering.scoring.embed import job_of
    from halsift.launch.cli import UsageError

    try:
        result = run_job(job_of(cfg), cfg.engine)
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
