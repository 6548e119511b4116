"""``halsift eval vigil``: the VIGIL pipeline with the leave-one-category-out grid search
(flags: :class:`halsift.eval.runs.vigil.VigilEvalConfig`; library: :func:`halsift.eval.runs.vigil.run_vigil`)."""

from halsift.eval.runs.vigil import VigilEvalConfig as CONFIG  # noqa: F401 (the flags' class, for docs/config.md)
from halsift.launch.eval_command import eval_command

HELP, add_arguments, run = eval_command("vigil", {"out": "DIR", "annotations": "JSON", "root": "DIR",
                                                  "vocab": "JSON", "clip_arch": "ARCH", "clip_pretrained": "TAG|PATH"})
