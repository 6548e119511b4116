"""Every evaluation by name: its settings class and its library function ``run_<name>(config) -> EvalResult``.

Adding an evaluation: write ``eval/runs/<name>.py`` (a ``<Name>EvalConfig`` dataclass declared with
:func:`halsift.corpus.config.field`, and ``run_<name>``) and add it here; ``halsift eval <name>`` takes its flags
from the config class (``launch/cmd_eval_<name>.py``), and an eval listed in :data:`RECIPE_EVALS` is also a typed
section of a recipe's ``evals:``. The modules import nothing heavy at import time, so recipe validation stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from halsift.eval.runs.bench import BenchEvalConfig, run_bench
from halsift.eval.runs.compositional import CompositionalEvalConfig, run_compositional
from halsift.eval.runs.ihalla import IhallaEvalConfig, run_ihalla
from halsift.eval.runs.retrieval import RetrievalEvalConfig, run_retrieval
from halsift.eval.runs.vigil import VigilEvalConfig, run_vigil
from halsift.eval.runs.vope import VopeEvalConfig, run_vope
from halsift.eval.runs.zeroshot import ZeroshotEvalConfig, run_zeroshot


@dataclass(frozen=True)
class EvalEntry:
    config: type
    run: Callable  # run(config, data=None) -> EvalResult; ``data`` only for evals with a synthetic source
    help: str  # one line (the command's --help)


EVALS: dict[str, EvalEntry] = {
    "bench": EvalEntry(BenchEvalConfig, run_bench, "evaluate detectors on an annotated bench: AUROC with CIs, "
                                                   "localization, ensembles, report and plots"),
    "retrieval": EvalEntry(RetrievalEvalConfig, run_retrieval, "image<->text retrieval recall (R@1/5/10, both "
                                                               "directions) of an open_clip model"),
    "zeroshot": EvalEntry(ZeroshotEvalConfig, run_zeroshot, "zero-shot classification (top-1/top-5 accuracy, mean "
                                                            "per-class recall) of an open_clip model, as "
                                                            "CLIP_benchmark"),
    "compositional": EvalEntry(CompositionalEvalConfig, run_compositional, "compositional hard negatives "
                                                                           "(SugarCrepe): true caption vs negative "
                                                                           "per category"),
    "ihalla": EvalEntry(IhallaEvalConfig, run_ihalla, "I-HallA: multiple-choice VQA score of text-to-image "
                                                      "generators (synthetic world or QA + predictions files)"),
    "vope": EvalEntry(VopeEvalConfig, run_vope, "VOPE: hallucination in factual description (Hal-D) vs voluntary "
                                                "imagination (Hal-I), Exp, CHAIR_i"),
    "vigil": EvalEntry(VigilEvalConfig, run_vigil, "VIGIL: recontextualization hallucination detection (mutation / "
                                                   "background / omission), LOCO grid search"),
}
RECIPE_EVALS = ("ihalla", "vope", "vigil")  # run by a recipe's eval stage from its typed `evals:` sections
