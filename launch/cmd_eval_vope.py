"""``halsift eval vope``: Hal-D, Hal-I, Exp and CHAIR_i of vision-language models per task (VOPE)
(flags: :class:`halsift.eval.runs.vope.VopeEvalConfig`; library: :func:`halsift.eval.runs.vope.run_vope`)."""

from halsift.eval.runs.vope import VopeEvalConfig as CONFIG  # noqa: F401 (the flags' class, for docs/config.md)
from halsift.launch.eval_command import eval_command

HELP, add_arguments, run = eval_command("vope", {"out": "DIR", "responses": "JSONL", "vocab": "JSON"})
