"""``halsift eval vigil``: VIGIL pipeline (object mutation, background inconsistency, object omission) with the
leave-one-category-out grid search, multi-label F1 per type and category, and trivial baselines."""

from __future__ import annotations

import argparse

HELP = "VIGIL: recontextualization hallucination detection (mutation / background / omission), LOCO grid search"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="writes metrics.json, report.md, findings.jsonl, plots/")
    parser.add_argument("--synthetic", action="store_true", help="synthetic composites in 5 product categories")
    parser.add_argument("--per-category", type=int, default=30, help="--synthetic: records per category (default: 30)")
    parser.add_argument("--seed", type=int, default=0, help="--synthetic: seed (default: 0)")
    parser.add_argument("--annotations", metavar="JSON", help="VIGIL annotation file (list of {generated_photo, hallucination})")
    parser.add_argument("--root", metavar="DIR", help="folder the annotation's image paths are relative to")


def run(args: argparse.Namespace) -> int:
    import json
    import os
    from pathlib import Path

    import numpy as np

    from halsift.eval.eval_report import fmt, md_table, save_plot, write_outputs
    from halsift.eval.vigil import (TYPES, ColourSegmenter, ColourShapeEncoder, VigilFormatError, analyze, decide,
                                    label_matrix, loco_search, multilabel_f1, read_vigil)
    from halsift.synth.vigil import VOCABULARY, synthetic_vigil
    from halsift.launch.cli import UsageError
    from halsift.corpus.progress import progress

    if args.synthetic:
        if args.annotations:
            raise UsageError("--synthetic: give either --synthetic or --annotations, not both")
        if args.per_category < 1:
            raise UsageError(f"--per-category: must be >= 1, got {args.per_category}")
        records = synthetic_vigil(args.per_category, args.seed)
        source = f"synthetic composites (seed {args.seed}, {args.per_category} per category)"
    elif args.annotations:
        try:
            records = read_vigil(args.annotations, args.root)
        except VigilFormatError as e:
            raise UsageError(f"--annotations: {e}") from None
        bad = [r.id for r in records if r.background is None or not r.references]
        if bad:
            raise UsageError(f"--annotations: records {', '.join(bad[:3])} lack background_photo/object_photos")
        source = f"`{args.annotations}`"
    else:
        raise UsageError("--annotations: give --annotations FILE or --synthetic")
    seg, enc = ColourSegmenter(), ColourShapeEncoder()
    analyses = [analyze(r, seg, enc, VOCABULARY) for r in progress(records, desc="vigil", unit="rec")]
    y = label_matrix([r.labels for r in records])
    cats = [r.category for r in records]
    pred, splits = loco_search(analyses, y, cats)
    metrics = multilabel_f1(y, pred, cats)
    baselines = {"always-present": np.ones_like(y), "never-present": np.zeros_like(y)}
    for name, p in baselines.items():
        metrics.update({f"baseline/{name}/{k[3:]}": v for k, v in multilabel_f1(y, p, cats).items()})
    metrics["records"] = len(records)
    for k, t in enumerate(TYPES):
        metrics[f"prevalence/{t}"] = float(y[:, k].mean())

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_by_cat = {s["category"]: s["config"] for s in splits}
    from halsift.eval.vigil import VigilConfig

    tmp = out / f".findings.jsonl.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for r, a in zip(records, analyses):
            fnd = decide(a, VigilConfig(**cfg_by_cat[r.category]))
            f.write(json.dumps({**fnd.to_json(), "category": r.category, "labels": r.labels}) + "\n")
    os.replace(tmp, out / "findings.jsonl")

    methods = {"VIGIL pipeline (LOCO)": "f1", **{f"{n} baseline": f"baseline/{n}" for n in baselines}}
    rows = [[m] + [fmt(metrics[f"{pre}/{t}"]) for t in (*TYPES, "macro", "macro_categories")]
            for m, pre in methods.items()]
    cats_sorted = sorted(set(cats))
    md = ["# VIGIL report", "", f"Source: {source}; {len(records)} records. Multi-label F1 per type (sklearn, "
          "zero_division=0), macro over types and over categories; parameters chosen leave-one-category-out.", "",
          "## F1 per hallucination type", "",
          md_table(["Method", *TYPES, "macro", "macro over categories"], rows), "",
          "## Macro F1 per category (held out)", "",
          md_table(["Category", "macro F1", "always-present", "chosen tau / margin / boxes", "train macro F1"],
                   [[c, fmt(metrics[f"f1/{c}/macro"]), fmt(metrics[f"baseline/always-present/{c}/macro"]),
                     f"{cfg_by_cat[c]['tau']} / {cfg_by_cat[c]['margin']} / {cfg_by_cat[c]['boxes']}",
                     fmt(next(s['train_f1'] for s in splits if s['category'] == c))] for c in cats_sorted]), "",
          "Per-record findings with explanations: `findings.jsonl`.", ""]

    def bars(fig, ax):
        x = np.arange(len(TYPES) + 1)
        for i, (m, pre) in enumerate(methods.items()):
            ax.bar(x + (i - 1) * 0.27, [metrics[f"{pre}/{t}"] for t in (*TYPES, "macro")], 0.27, label=m)
        ax.set_xticks(x, [*TYPES, "macro"])
        ax.set_ylim(0, 1)
        ax.set_ylabel("F1")
        ax.legend(fontsize=7)

    plots = [("F1 per type: pipeline vs trivial baselines", save_plot(out, "vigil_f1.png", bars))]
    write_outputs(out, metrics, md, plots)
    print(f"macro F1 {metrics['f1/macro']:.3f} (always-present {metrics['baseline/always-present/macro']:.3f}, "
          f"never-present {metrics['baseline/never-present/macro']:.3f})")
    return 0
