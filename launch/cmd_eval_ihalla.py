"""``halsift eval ihalla``: I-HallA and I-HallA† per text-to-image generator, per CoI and per category."""

from __future__ import annotations

import argparse

HELP = "I-HallA: multiple-choice VQA score of text-to-image generators (synthetic world or QA + predictions files)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="writes metrics.json, report.md and plots/ here")
    parser.add_argument("--synthetic", action="store_true",
                        help="generate QA sets from the synthetic t2i prompts and answer them with the scene oracle")
    parser.add_argument("--answerer", metavar="SPEC",
                        help="--synthetic: answer with a VLM detector spec (e.g. vlm:model=PATH) instead of the "
                             "scene oracle; it sees the rendered images")
    parser.add_argument("--answer-mode", choices=("logits", "generate"), default="logits",
                        help="--answerer: 'logits' picks the most likely letter A-E in one forward pass (never "
                             "fails); 'generate' parses a greedy reply (default: logits)")
    parser.add_argument("--prompts", type=int, default=40, help="--synthetic: number of prompts (default: 40)")
    parser.add_argument("--seed", type=int, default=0, help="--synthetic: seed (default: 0)")
    parser.add_argument("--qa", metavar="CSV|XLSX", help="QA sets, official layout (index, CoI, question, choices, answer)")
    parser.add_argument("--predictions", metavar="CSV",
                        help="VQA answers: generator, index, question_no (1-based), prediction (letter or reply)")
    parser.add_argument("--reference", metavar="CSV", help="optional per-image reference judgments: generator, index, score")


def _report(metrics: dict, scores, coi, cats, true_error: dict | None, source: str) -> list[str]:
    from halsift.eval.eval_report import fmt, md_table

    rows = [[g, fmt(r["ihalla"]), fmt(r["strict"]), int(r["prompts"]), fmt(100 * r["failure_rate"], 1)]
            + ([fmt(true_error[g])] if true_error else []) for g, r in scores.iterrows()]
    header = ["Generator", "I-HallA", "I-HallA†", "prompts", "parse failures %"] + (
        ["true error rate"] if true_error else [])
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


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np

    from halsift.eval.eval_report import save_plot, write_outputs
    from halsift.eval.ihalla import (answer_all, correlations, ihalla_metrics, ihalla_scores, load_predictions,
                                     load_qa, load_reference)
    from halsift.launch.cli import UsageError

    true_error = None
    if args.synthetic:
        if args.qa or args.predictions:
            raise UsageError("--synthetic: give either --synthetic or --qa/--predictions, not both")
        if args.prompts < 1:
            raise UsageError(f"--prompts: must be >= 1, got {args.prompts}")
        from halsift.synth.ihalla import SceneOracle, synthetic_ihalla

        data = synthetic_ihalla(args.prompts, args.seed)
        if args.answerer:
            from halsift.eval.ihalla import vlm_answerer

            try:
                answerer = vlm_answerer(args.answerer, args.answer_mode)
            except ValueError as e:
                raise UsageError(f"--answerer: {e}") from e
            who = f"VLM answerer `{args.answerer}` ({args.answer_mode})"
        else:
            answerer, who = SceneOracle(), "scene-graph oracle answerer"
        answers = answer_all(data.qa_sets, data.images, answerer, show_progress=True)
        reference, true_error = data.reference, data.true_error
        source = f"synthetic world (seed {args.seed}, {args.prompts} prompts, {who})"
    else:
        if args.answerer:
            raise UsageError("--answerer: only with --synthetic (with --qa, give the answers as --predictions)")
        if not args.qa or not args.predictions:
            raise UsageError("--qa: give --qa and --predictions (or --synthetic)")
        qa = load_qa(args.qa)
        answers = load_predictions(args.predictions, qa)
        if answers.empty:
            raise UsageError(f"--predictions: {args.predictions} has no rows")
        reference = load_reference(args.reference) if args.reference else None
        source = f"QA `{args.qa}`, predictions `{args.predictions}`"
    metrics = ihalla_metrics(answers, reference)
    scores = ihalla_scores(answers)
    if true_error:
        c = correlations(scores["ihalla"], [-true_error[g] for g in scores.index])
        metrics["rank/spearman"] = c["spearman"]
        metrics.update({f"true_error/{g}": v for g, v in true_error.items()})
    coi = answers.pivot_table(index="generator", columns="coi", values="correct", aggfunc="mean")
    from halsift.eval.ihalla import prompt_scores

    cats = prompt_scores(answers).pivot_table(index="generator", columns="category", values="score", aggfunc="mean")
    out = Path(args.out)

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

    plots = [("I-HallA and I-HallA† per generator", save_plot(out, "ihalla_scores.png", bars)),
             ("Fraction correct per CoI", save_plot(out, "ihalla_coi.png", heat))]
    write_outputs(out, metrics, _report(metrics, scores, coi, cats, true_error, source), plots)
    print(" ".join(f"{g}={r['ihalla']:.3f}/{r['strict']:.3f}" for g, r in scores.iterrows()))
    return 0
