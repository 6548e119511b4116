"""``halsift train clip``: fine-tune an open_clip model on shards (flags mirror ClipTrainConfig's fields)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

HELP = "fine-tune CLIP (open_clip + accelerate) on shards; retrieval + bench detection evaluated in the loop"

# list fields take several values; booleans are on/off switches (--lock-image / --no-lock-image)
_SHORT = {"data": "SHARDS", "out": "DIR", "model": "ARCH", "pretrained": "TAG|PATH"}


def _fields():
    from halsift.training.clip_config import ClipTrainConfig

    hints = typing.get_type_hints(ClipTrainConfig)
    return ClipTrainConfig, [(f, hints[f.name]) for f in dataclasses.fields(ClipTrainConfig)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cls, fields = _fields()
    parser.add_argument("--config", metavar="YAML", help="YAML with ClipTrainConfig keys; flags override it")
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
    """YAML (``--config``) overlaid with the flags given on the command line -> validated ClipTrainConfig."""
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
        from halsift.training.clip_config import check_model_name

        check_model_name(cfg.model)
    except (ConfigError, ValueError) as e:
        msg = str(e)
        field = msg.split(":", 1)[0]
        if field.isidentifier():  # "batch_size: must be >= 1" -> "--batch-size: must be >= 1"
            msg = "--" + field.replace("_", "-") + msg[len(field):]
        raise UsageError(msg) from None
    from halsift.training.clip_train import NonFiniteLossError, train

    try:
        metrics = train(cfg)
    except NonFiniteLossError as e:
        print(f"halsift train clip: {e}", file=sys.stderr)
        return 1
    if metrics:
        print(" ".join(f"{k}={v:.2f}" for k, v in sorted(metrics.items()) if "@" in k or k.startswith("auroc/")))
    return 0
