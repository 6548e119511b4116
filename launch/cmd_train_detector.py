"""``halsift train detector``: LoRA fine-tuning of a clip or vlm detector on an annotated bench (flags mirror
DetectorTrainConfig's fields); the result is a detector spec ``lora:OUT/adapter``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

HELP = "LoRA fine-tune a clip or vlm detector on an annotated bench; writes OUT/adapter (spec lora:OUT/adapter)"

_SHORT = {"base": "SPEC", "bench": "BENCH.jsonl", "out": "DIR", "target_modules": "NAME"}


def _fields():
    from halsift.training.detector_config import DetectorTrainConfig

    hints = typing.get_type_hints(DetectorTrainConfig)
    return DetectorTrainConfig, [(f, hints[f.name]) for f in dataclasses.fields(DetectorTrainConfig)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cls, fields = _fields()
    parser.add_argument("--config", metavar="YAML", help="YAML with DetectorTrainConfig keys; flags override it")
    for f, tp in fields:
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kw = dict(dest=f.name, default=argparse.SUPPRESS, help=f"{f.metadata['help']} (default: {default!r})")
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif typing.get_origin(tp) is list:
            parser.add_argument(flag, nargs="+", type=typing.get_args(tp)[0], metavar=_SHORT.get(f.name), **kw)
        else:
            parser.add_argument(flag, type=tp, metavar=_SHORT.get(f.name), **kw)


def build_config(args: argparse.Namespace):
    """YAML (``--config``) overlaid with the flags given on the command line -> validated DetectorTrainConfig."""
    from halsift.launch.config import from_dict, load_yaml

    cls, fields = _fields()
    data = load_yaml(args.config) if getattr(args, "config", None) else {}
    for f, _ in fields:
        if hasattr(args, f.name):
            data[f.name] = getattr(args, f.name)
    return from_dict(cls, data)


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError
    from halsift.launch.config import ConfigError

    try:
        cfg = build_config(args)
        cfg.resolved_kind()
    except (ConfigError, ValueError) as e:
        msg = str(e)
        field = msg.split(":", 1)[0]
        if field.isidentifier():  # "batch_size: must be >= 1" -> "--batch-size: must be >= 1"
            msg = "--" + field.replace("_", "-") + msg[len(field):]
        raise UsageError(msg) from None
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
