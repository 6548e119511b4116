"""``halsift eval bench``: the AlignBench / HalDec-Bench sentence-level detection evaluation
(flags: :class:`halsift.eval.runs.bench.BenchEvalConfig`; library: :func:`halsift.eval.runs.bench.run_bench`)."""

from halsift.eval.runs.bench import BenchEvalConfig as CONFIG  # noqa: F401 (the flags' class, for docs/config.md)
from halsift.launch.eval_command import eval_command

HELP, add_arguments, run = eval_command("bench", {"scores": "DIR", "detector": "SPEC", "out": "DIR",
                                                  "self_preference": "DET=GEN", "ensemble": "A+B",
                                                  "likelihood": "SPEC", "likelihood_images": "N"})
