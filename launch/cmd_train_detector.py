"""``halsift train detector``: LoRA fine-tuning of a clip or vlm detector on an annotated bench (flags mirror
DetectorTrainConfig's fields); the result is a detector spec ``lora:OUT/adapter``."""

from __future__ import annotations

import argparse
import sys

from halsift.launch.describe import add_describe_argument
from halsift.training.detector_config import DetectorTrainConfig

HELP = "LoRA fine-tune a clip or vlm detector on an annotated bench; writes OUT/adapter (spec lora:OUT/adapter)"

_SHORT = {"base": "SPEC", "bench": "BENCH.jsonl", "out": "DIR", "target_modules": "NAME"}

CONFIG = DetectorTrainConfig  # the settings (docs/config.md, --describe)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from halsift.corpus.config import add_dataclass_arguments

    add_dataclass_arguments(parser, DetectorTrainConfig, _SHORT)
    add_describe_argument(parser, DetectorTrainConfig, detectors=True)


def build_config(args: argparse.Namespace):
    """YAML (``--config``) overlaid with the flags given on the command line -> validated DetectorTrainConfig."""
    from halsift.corpus.config import config_from_args

    return config_from_args(DetectorTrainConfig, args)


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError
    from halsift.corpus.config import ConfigError, flag_message

    try:
        cfg = build_config(args)
        cfg.resolved_kind()
    except (ConfigError, ValueError) as e:
        raise UsageError(flag_message(str(e))) from None
    from halsift.training.detector_train import train_detector

    try:
        result = train_detector(cfg)
    except FloatingPointError as e:
        print(f"halsift train detector: {e}", file=sys.stderr)
        return 1
    auc = result.get("val/auroc")
    print(f"detector: lora:{result['adapter']}  best step {result['best_step']}"
          + (f"  val auroc {auc:.2f}" if auc is not None else ""))
    return 0
