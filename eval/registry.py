"""Every evaluation by name, with what a command and a recipe need of it: its settings class, its library function
``run_<name>(config, data=None) -> EvalResult``, its help and flag metavars, and how a recipe runs it.

Everything else is generated from :data:`EVALS`: ``halsift eval NAME`` (flags, ``--describe``, docs/config.md:
``launch/eval_command.py``), a recipe's ``evals.NAME`` section for an entry with ``section`` help
(``launch/recipe_config.EvalsCfg``), and the eval stage's run of an entry with ``per_model`` on every model it
loads (``launch/stages/eval.py``; the recipe says where its sets come from). Adding an evaluation: write
``eval/runs/<name>.py`` (a ``<Name>EvalConfig`` dataclass declared with :func:`halsift.corpus.config.field`, and
``run_<name>``) and add its entry here. The modules import nothing heavy at import time, so recipe validation
stays fast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from halsift.eval.runs import compositional, retrieval, zeroshot
from halsift.eval.runs.bench import BenchEvalConfig, run_bench
from halsift.eval.runs.compositional import CompositionalEvalConfig, run_compositional
from halsift.eval.runs.ihalla import IhallaEvalConfig, run_ihalla
from halsift.eval.runs.per_model import PerModel
from halsift.eval.runs.retrieval import RetrievalEvalConfig, run_retrieval
from halsift.eval.runs.vigil import VigilEvalConfig, run_vigil
from halsift.eval.runs.vope import VopeEvalConfig, run_vope
from halsift.eval.runs.zeroshot import ZeroshotEvalConfig, run_zeroshot

_CLIP = {"model": "ARCH", "pretrained": "TAG|PATH"}  # the metavars of the settings every CLIP evaluation shares


@dataclass(frozen=True)
class EvalEntry:
    """One evaluation: what ``halsift eval NAME`` and a recipe's eval stage need of it."""

    config: type  # its settings: the command's flags, a recipe section's keys
    run: Callable  # run(config, data=None) -> EvalResult; ``data``: inputs the caller already holds (below)
    help: str  # one line (the command's --help)
    metavars: Mapping[str, str] = field(default_factory=dict)  # setting -> its flag's metavar (``--out DIR``)
    detector_specs: bool = False  # its settings take detector specs: --describe lists the families' options too
    per_model: PerModel | None = None  # run by a recipe's eval stage on every model it loads
    section: str = ""  # help of its recipe section ``evals.NAME`` (its settings, run by the eval stage); '' = none


EVALS: dict[str, EvalEntry] = {
    # data: the score tables by detector name (a recipe's score stage's), instead of reading config.scores
    "bench": EvalEntry(BenchEvalConfig, run_bench, "evaluate detectors on an annotated bench: AUROC with CIs, "
                                                   "localization, ensembles, report and plots",
                       {"scores": "DIR", "detector": "SPEC", "out": "DIR", "self_preference": "DET=GEN",
                        "ensemble": "A+B", "likelihood": "SPEC", "likelihood_images": "N"}, detector_specs=True),
    "retrieval": EvalEntry(RetrievalEvalConfig, run_retrieval, "image<->text retrieval recall (R@1/5/10, both "
                                                               "directions) of an open_clip model",
                           {**_CLIP, "data": "DIR|JSONL", "out": "DIR"},
                           per_model=PerModel(retrieval.read_sets, retrieval.evaluate_sets, "retrieval.json",
                                              "retrieval_ranks.npz")),
    "zeroshot": EvalEntry(ZeroshotEvalConfig, run_zeroshot, "zero-shot classification (top-1/top-5 accuracy, mean "
                                                            "per-class recall) of an open_clip model, as "
                                                            "CLIP_benchmark",
                          {**_CLIP, "data": "DIR", "out": "DIR", "classnames": "FILE", "templates": "FILE"},
                          per_model=PerModel(zeroshot.read_sets, zeroshot.evaluate_sets, "beyond.json",
                                             "beyond_hits.npz")),
    "compositional": EvalEntry(CompositionalEvalConfig, run_compositional, "compositional hard negatives "
                                                                           "(SugarCrepe): true caption vs negative "
                                                                           "per category",
                               {**_CLIP, "data": "DIR|JSON", "images": "DIR", "out": "DIR"},
                               per_model=PerModel(compositional.read_sets, compositional.evaluate_sets,
                                                  "beyond.json", "beyond_hits.npz")),
    # data (ihalla, vope, vigil): the synthetic world's, built by launch/eval_command.synthetic_data
    "ihalla": EvalEntry(IhallaEvalConfig, run_ihalla, "I-HallA: multiple-choice VQA score of text-to-image "
                                                      "generators (synthetic world or QA + predictions files)",
                        {"out": "DIR", "answerer": "SPEC", "qa": "CSV|XLSX", "predictions": "CSV",
                         "reference": "CSV"},
                        section="I-HallA (`halsift eval ihalla` settings, e.g. {synthetic: true, prompts: 30} or "
                                "{qa: FILE, predictions: FILE})"),
    "vope": EvalEntry(VopeEvalConfig, run_vope, "VOPE: hallucination in factual description (Hal-D) vs voluntary "
                                                "imagination (Hal-I), Exp, CHAIR_i",
                      {"out": "DIR", "responses": "JSONL", "vocab": "JSON"},
                      section="VOPE (`halsift eval vope` settings, e.g. {synthetic: true} or {responses: FILE, "
                              "vocab: FILE})"),
    "vigil": EvalEntry(VigilEvalConfig, run_vigil, "VIGIL: recontextualization hallucination detection (mutation / "
                                                   "background / omission), LOCO grid search",
                       {"out": "DIR", "annotations": "JSON", "root": "DIR", "vocab": "JSON", "clip_arch": "ARCH",
                        "clip_pretrained": "TAG|PATH"},
                       section="VIGIL (`halsift eval vigil` settings, e.g. {synthetic: true} or {annotations: "
                               "FILE})"),
}


def recipe_sections() -> tuple[str, ...]:
    """The evaluations a recipe runs from its typed ``evals:`` sections, in registry order."""
    return tuple(name for name, e in EVALS.items() if e.section)


def per_model_evals() -> dict[str, PerModel]:
    """The evaluations a recipe's eval stage runs on every model it loads, in registry order."""
    return {name: e.per_model for name, e in EVALS.items() if e.per_model is not None}
