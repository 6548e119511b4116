"""``halsift eval ihalla``: I-HallA and I-HallA† per text-to-image generator, per CoI and per category
(flags: :class:`halsift.eval.runs.ihalla.IhallaEvalConfig`; library: :func:`halsift.eval.runs.ihalla.run_ihalla`)."""

from halsift.eval.runs.ihalla import IhallaEvalConfig as CONFIG  # noqa: F401 (the flags' class, for docs/config.md)
from halsift.launch.eval_command import eval_command

HELP, add_arguments, run = eval_command("ihalla", {"out": "DIR", "answerer": "SPEC", "qa": "CSV|XLSX",
                                                   "predictions": "CSV", "reference": "CSV"})
