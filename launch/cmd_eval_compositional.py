"""``halsift eval compositional``: SugarCrepe-style compositional hard negatives of an open_clip model (flags:
:class:`halsift.eval.runs.compositional.CompositionalEvalConfig`; library:
:func:`halsift.eval.runs.compositional.run_compositional`)."""

from halsift.eval.runs.compositional import CompositionalEvalConfig as CONFIG  # noqa: F401 (the flags' class)
from halsift.launch.eval_command import eval_command

HELP, add_arguments, run = eval_command("compositional", {"model": "ARCH", "pretrained": "TAG|PATH",
                                                          "data": "DIR|JSON", "images": "DIR", "out": "DIR"})
