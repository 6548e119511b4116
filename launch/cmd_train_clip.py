"""``halsift train clip``: fine-tune an open_clip model on shards (flags mirror ClipTrainConfig's fields)."""

from __future__ import annotations

import argparse
import sys

from halsift.launch.describe import config_arguments, parsed_config
from halsift.training.clip_config import ClipTrainConfig

HELP = "fine-tune CLIP (open_clip + accelerate) on shards; retrieval + bench detection evaluated in the loop"

# list fields take several values; booleans are on/off switches (--lock-image / --no-lock-image)
_SHORT = {"data": "SHARDS", "out": "DIR", "model": "ARCH", "pretrained": "TAG|PATH"}

CONFIG = ClipTrainConfig  # the settings (docs/config.md, --describe)
add_arguments = config_arguments(ClipTrainConfig, _SHORT)


def _check(cfg: ClipTrainConfig) -> None:
    from halsift.training.clip_config import check_model_name

    check_model_name(cfg.model)


def run(args: argparse.Namespace) -> int:
    cfg = parsed_config(ClipTrainConfig, args, _check)
    from halsift.training.clip_train import NonFiniteLossError, train

    try:
        metrics = train(cfg)
    except NonFiniteLossError as e:
        print(f"halsift train clip: {e}", file=sys.stderr)
        return 1
    if metrics:
        print(" ".join(f"{k}={v:.2f}" for k, v in sorted(metrics.items()) if "@" in k or k.startswith("auroc/")))
    return 0
