"""``halsift train clip``: fine-tune an open_clip model on shards (flags mirror ClipTrainConfig's fields)."""

from __future__ import annotations

import argparse
import sys

from halsift.launch.describe import add_describe_argument
from halsift.training.clip_config import ClipTrainConfig

HELP = "fine-tune CLIP (open_clip + accelerate) on shards; retrieval + bench detection evaluated in the loop"

# list fields take several values; booleans are on/off switches (--lock-image / --no-lock-image)
_SHORT = {"data": "SHARDS", "out": "DIR", "model": "ARCH", "pretrained": "TAG|PATH"}

CONFIG = ClipTrainConfig  # the settings (docs/config.md, --describe)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from halsift.corpus.config import add_dataclass_arguments

    add_dataclass_arguments(parser, ClipTrainConfig, _SHORT)
    add_describe_argument(parser, ClipTrainConfig)


def build_config(args: argparse.Namespace):
    """YAML (``--config``) overlaid with the flags given on the command line -> validated ClipTrainConfig."""
    from halsift.corpus.config import config_from_args

    return config_from_args(ClipTrainConfig, args)


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError
    from halsift.corpus.config import ConfigError, flag_message

    try:
        cfg = build_config(args)
        from halsift.training.clip_config import check_model_name

        check_model_name(cfg.model)
    except (ConfigError, ValueError) as e:
        raise UsageError(flag_message(str(e))) from None
    from halsift.training.clip_train import NonFiniteLossError, train

    try:
        metrics = train(cfg)
    except NonFiniteLossError as e:
        print(f"halsift train clip: {e}", file=sys.stderr)
        return 1
    if metrics:
        print(" ".join(f"{k}={v:.2f}" for k, v in sorted(metrics.items()) if "@" in k or k.startswith("auroc/")))
    return 0
