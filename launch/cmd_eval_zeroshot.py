"""``halsift eval zeroshot``: zero-shot classification of an open_clip model on a CLIP_benchmark wds folder or an
ImageFolder (flags: :class:`halsift.eval.runs.zeroshot.ZeroshotEvalConfig`; library:
:func:`halsift.eval.runs.zeroshot.run_zeroshot`)."""

from halsift.eval.runs.zeroshot import ZeroshotEvalConfig as CONFIG  # noqa: F401 (the flags' class, for docs/config.md)
from halsift.launch.eval_command import eval_command

HELP, add_arguments, run = eval_command("zeroshot", {"model": "ARCH", "pretrained": "TAG|PATH", "data": "DIR",
                                                     "out": "DIR", "classnames": "FILE", "templates": "FILE"})
