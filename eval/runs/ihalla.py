"""``run_ihalla``: I-HallA and I-HallA† per text-to-image generator, per CoI and per category, with report and plots.

Real data: the QA sets and recorded answers named in the config. The synthetic world is not part of the library:
:func:`halsift.synth.ihalla.synthetic_answers` builds the same :class:`IhallaAnswers` from it (``halsift eval
ihalla --synthetic`` and recipes wire it in).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halsift.corpus.config import ConfigError, field
from halsift.eval.result import EvalResult
from halsift.eval.metrics.ihalla import ANSWER_MODES
from halsift.eval.source import check_source, resolve_data



@dataclass
class IhallaEvalConfig:
    out: str = field("", help="output folder: metrics.json, report.md and plots/")
    synthetic: bool = field(False, help="generate QA sets from the synthetic t2i prompts and answer them with the "
                                        "scene oracle")
    answerer: str = field("", help="synthetic: answer with a VLM detector spec (e.g. vlm:model=PATH) instead of "
                                   "the scene oracle; it sees the rendered images")
    answer_mode: str = field("logits", help="answerer: 'logits' picks the most likely letter A-E in one forward pass "
                                            "(never fails); 'generate' parses a greedy reply")
    prompts: int = field(40, range="[1, inf)", help="synthetic: number of prompts")
    seed: int = field(0, range="[0, inf)", help="synthetic: seed")
    qa: str = field("", help="QA sets, official layout (index, CoI, question, choices, answer), CSV or XLSX")
    predictions: str = field("", help="VQA answers (CSV): generator, index, question_no (1-based), prediction "
                                      "(letter or reply)")
    reference: str = field("", help="optional per-image reference judgments (CSV): generator, index, score")

    def validate(self) -> None:
        if self.answer_mode not in ANSWER_MODES:
            raise ValueError(f"answer_mode: expected one of {ANSWER_MODES}, got {self.answer_mode!r}")
        if self.answerer and not self.synthetic:
            raise ValueError("answerer: only with synthetic (with qa, give the answers as predictions)")
        check_source(self.synthetic, {"qa": self.qa, "predictions": self.predictions}, "prompts", self.prompts)


@dataclass
class IhallaAnswers:
    """What the metrics are computed from: one row per (generator, question) (:func:`eval.metrics.ihalla.answer_all`)."""

    answers: Any  # pandas DataFrame
    reference: Any = None  # per-image reference judgments, or None
    true_error: dict[str, float] | None = None  # the synthetic world's true error rate per generator
    source: str = ""  # one line for the report


def load_answers(cfg: IhallaEvalConfig) -> IhallaAnswers:
    """The answers recorded in ``cfg.qa`` / ``cfg.predictions`` (and ``cfg.reference``)."""
    from halsift.eval.metrics.ihalla import load_predictions, load_qa, load_reference

    qa = load_qa(cfg.qa)
    answers = load_predictions(cfg.predictions, qa)
    if answers.empty:
        raise ConfigError(f"predictions: {cfg.predictions} has no rows")
    reference = load_reference(cfg.reference) if cfg.reference else None
    return IhallaAnswers(answers, reference, None, f"QA `{cfg.qa}`, predictions `{cfg.predictions}`")


def answer_with(cfg: IhallaEvalConfig, qa_sets, images, oracle) -> tuple[Any, str]:
    """Answer ``qa_sets`` on ``images`` with ``cfg.answerer`` (a VLM spec) or, without one, ``oracle``; returns
    the answers and who gave them."""
    from halsift.eval.metrics.ihalla import answer_all, vlm_answerer

    if cfg.answerer:
        try:
            answerer = vlm_answerer(cfg.answerer, cfg.answer_mode)
        except ValueError as e:
            raise ConfigError(f"answerer: {e}") from None
        who = f"VLM answerer `{cfg.answerer}` ({cfg.answer_mode})"
    else:
        answerer, who = oracle, "scene-graph oracle answerer"
    return answer_all(qa_sets, images, answerer, show_progress=True), who


def _report(metrics: dict, scores, coi, cats, true_error: dict | None, source: str) -> list[str]:
    from halsift.eval.report.markdown import fmt, md_table

    rows = [[g, fmt(r["ihalla"]), fmt(r["strict"]), int(r["prompts"]), fmt(r["failure_rate"], 1)]
            + ([fmt(metrics[f"true_error/{g}"], 1)] if true_error else []) for g, r in scores.iterrows()]
    header = ["Generator", "I-HallA", "I-HallA†", "prompts", "parse failures %"] + (
        ["true error rate %"] if true_error else [])
    md = ["# I-HallA report", "", f"Source: {source}. I-HallA = mean over prompts of the fraction of questions answered "
          "correctly (Eq. 1); I-HallA† counts a prompt only when all its questions are right. Unparsed answers count "
          "as wrong.", "", "## Scores per generator (Table 3)", "", md_table(header, rows), ""]
    if "rank/spearman" in metrics:
        md += [f"Ranking by I-HallA vs ranking by true error rate: Spearman ρ = {fmt(metrics['rank/spearman'])}.", ""]
    md += ["## Fraction correct per composition of interest (Fig. 4)", "",
           md_table(["Generator"] + list(coi.columns), [[g] + [fmt(v) for v in r] for g, r in coi.iterrows()]), ""]
    md += ["## I-HallA per category", "",
           md_table(["Generator"] + list(cats.columns), [[g] + [fmt(v) for v in r] for g, r in cats.iterrows()]), ""]
    if "correlation/pearson" in metrics:
        md += ["## Correlation with reference judgments (per image)", "",
               md_table(["n", "Pearson r", "Spearman ρ", "Kendall τ"],
                        [[int(metrics["correlation/n"]), fmt(metrics["correlation/pearson"]),
                          fmt(metrics["correlation/spearman"]), fmt(metrics["correlation/kendall"])]]), ""]
    return md


def _plots(out: Path, scores, coi) -> list[tuple[str, Path]]:
    import numpy as np

    from halsift.eval.report.outputs import save_plot

    def bars(fig, ax):
        x = np.arange(len(scores))
        ax.bar(x - 0.2, scores["ihalla"], 0.4, label="I-HallA")
        ax.bar(x + 0.2, scores["strict"], 0.4, label="I-HallA†")
        ax.set_xticks(x, scores.index, rotation=30, ha="right")
        ax.set_ylim(0, 1)
        ax.set_ylabel("score")
        ax.legend()

    def heat(fig, ax):
        im = ax.imshow(coi.to_numpy(dtype=float), vmin=0, vmax=1, cmap="viridis")
        ax.set_xticks(range(coi.shape[1]), coi.columns, rotation=30, ha="right")
        ax.set_yticks(range(coi.shape[0]), coi.index)
        fig.colorbar(im, ax=ax)

    return [("I-HallA and I-HallA† per generator", save_plot(out, "ihalla_scores.png", bars)),
            ("Fraction correct per CoI", save_plot(out, "ihalla_coi.png", heat))]


def run_ihalla(config: IhallaEvalConfig, data: IhallaAnswers | None = None) -> EvalResult:
    """Compute the I-HallA metrics and write ``metrics.json``, ``report.md`` and plots to ``config.out``.

    ``data``: answers built elsewhere (the synthetic world's); by default those recorded in ``config.qa`` /
    ``config.predictions``.
    """
    from halsift.corpus.percent import percent
    from halsift.eval.report.outputs import write_outputs
    from halsift.eval.metrics.ihalla import correlations, ihalla_metrics, ihalla_scores, prompt_scores

    data = resolve_data(config, data, load_answers, "halsift.synth.ihalla.synthetic_answers")
    answers, true_error = data.answers, data.true_error
    metrics = ihalla_metrics(answers, data.reference)
    scores = ihalla_scores(answers)
    if true_error:
        c = correlations(scores["ihalla"], [-true_error[g] for g in scores.index])
        metrics["rank/spearman"] = c["spearman"]
        metrics.update({f"true_error/{g}": percent(v) for g, v in true_error.items()})
    coi = answers.pivot_table(index="generator", columns="coi", values="correct", aggfunc="mean")
    cats = prompt_scores(answers).pivot_table(index="generator", columns="category", values="score", aggfunc="mean")
    out = Path(config.out)
    result = write_outputs(out, metrics, _report(metrics, scores, coi, cats, true_error, data.source),
                           _plots(out, scores, coi))
    result.summary = " ".join(f"{g}={r['ihalla']:.3f}/{r['strict']:.3f}" for g, r in scores.iterrows())
    return result
