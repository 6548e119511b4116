"""``halsift eval vope``: Hal-D, Hal-I, Exp and CHAIR_i of vision-language models per task (VOPE)."""

from __future__ import annotations

import argparse

HELP = "VOPE: hallucination in factual description (Hal-D) vs voluntary imagination (Hal-I), Exp, CHAIR_i"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="writes metrics.json, report.md and plots/ here")
    parser.add_argument("--synthetic", action="store_true", help="simulated responders on synthetic scenes")
    parser.add_argument("--images", type=int, default=100, help="--synthetic: images per task (default: 100)")
    parser.add_argument("--seed", type=int, default=0, help="--synthetic: seed (default: 0)")
    parser.add_argument("--responses", metavar="JSONL",
                        help="recorded responses: model, task, image_id, response, present, presence[, objects, relevance]")
    parser.add_argument("--unparsed", choices=("yes", "no", "exclude"), default="yes",
                        help="--responses: a re-check reply that is neither yes nor no counts as yes (default, as the "
                             "official code), as no, or is left out (counted in unparsed_rate either way)")
    parser.add_argument("--vocab", metavar="JSON",
                        help="object vocabulary {object: [synonyms]} for extraction (default: the synthetic world's)")


_NO_PUNCT = r"^\s*no\s*[.!,;:]"  # "No." / "No, ...": the official code reads these as yes; here they are no


def _records_from_file(path: str, vocab_path: str | None, unparsed: str = "yes"):
    import json
    import re

    from halsift.eval.vope import ObjectVocabulary, TableResponder, VopeRecord, classify, read_responses
    from halsift.synth.vope import synth_vocabulary
    from halsift.launch.cli import UsageError

    try:
        rows = read_responses(path)
    except ValueError as e:
        raise UsageError(f"--responses: {e}") from None
    if vocab_path:
        try:
            with open(vocab_path, encoding="utf-8") as f:
                vocab = ObjectVocabulary(json.load(f))
        except (OSError, ValueError, AttributeError) as e:
            raise UsageError(f"--vocab: {vocab_path}: expected a JSON object {{object: [synonyms]}} ({e})") from None
    else:
        vocab = synth_vocabulary()
    default = {"yes": True, "no": False, "exclude": None}[unparsed]
    records, truth, no_punct = [], {}, 0
    for r in rows:
        objs = r.get("objects") or vocab.extract(r["response"])
        replay = TableResponder({r["image_id"]: r["presence"]})
        beliefs = {o: replay.is_present(r["image_id"], o) for o in objs}
        no_punct += sum(isinstance(r["presence"].get(o), str) and bool(re.match(_NO_PUNCT, r["presence"][o], re.I))
                        for o in objs)
        sets = classify(objs, beliefs, r["present"], default=default)
        rec = VopeRecord(r["model"], r["task"], r["image_id"], {s: sets[s] for s in ("D_T", "D_H", "I_T", "I_H")},
                         sets["unparsed"], {o: int(v) for o, v in (r.get("relevance") or {}).items()
                                            if o in sets["D_H"] + sets["I_T"]}, sets.get("defaulted", []))
        records.append(rec)
        truth[r["image_id"]] = r["present"]
    return records, truth, no_punct


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np

    from halsift.eval.eval_report import fmt, md_table, save_plot, write_outputs
    from halsift.eval.vope import records_frame, vope_metrics
    from halsift.launch.cli import UsageError

    designed = None
    if args.synthetic:
        if args.responses:
            raise UsageError("--synthetic: give either --synthetic or --responses, not both")
        if args.images < 1:
            raise UsageError(f"--images: must be >= 1, got {args.images}")
        from halsift.synth.vope import PROFILES, TASKS, designed_rates, run_synthetic

        records, _ = run_synthetic(args.images, args.seed)
        designed = {(p.name, t): designed_rates(p, t) for p in PROFILES for t in TASKS}
        source = f"synthetic world (seed {args.seed}, {args.images} images per task, simulated responders)"
    elif args.responses:
        records, _, no_punct = _records_from_file(args.responses, args.vocab, args.unparsed)
        source = (f"`{args.responses}`; re-check replies that are neither yes nor no: "
                  + {"yes": "counted as yes (as the official code)", "no": "counted as no",
                     "exclude": "left out"}[args.unparsed]
                  + f"; {no_punct} replies like 'No.' read as no (the official code reads them as yes, a bug)")
    else:
        raise UsageError("--responses: give --responses FILE or --synthetic")
    metrics = vope_metrics(records)
    if args.responses:
        metrics["parse/no_punct_replies"] = float(no_punct)
    df = records_frame(records)
    pairs = sorted({(r.model, r.task) for r in records})
    header = ["Model", "Task", "#D_T", "#D_H", "#I_T", "#I_H", "Hal-D ↓", "Hal-I ↓", "Exp", "CHAIR_i"]
    rows = []
    for mo, t in pairs:
        k = f"{mo}/{t}"
        cells = [mo, t] + [int(metrics[f"{k}/n/{s}"]) for s in ("D_T", "D_H", "I_T", "I_H")]
        for name in ("hal_d", "hal_i", "exp", "chair_i"):
            v = fmt(metrics[f"{k}/{name}"])
            cells.append(f"{v} ({fmt(designed[(mo, t)][name])})" if designed else v)
        rows.append(cells)
    md = ["# VOPE report", "", f"Source: {source}; {len(df)} responses.",
          "Hal-D = |D_H|/(|D_T|+|D_H|), Hal-I = |I_H|/(|I_T|+|I_H|), Exp = (|I_T|+|I_H|)/all, "
          "CHAIR_i = (|D_H|+|I_T|)/all." + (" Designed values in parentheses." if designed else ""), "",
          "## Metrics per model and task (Table 1)", "", md_table(header, rows), ""]
    rel = [(mo, s, [int(metrics.get(f"{mo}/all/relevance/{s}/{k}", 0)) for k in (1, 2, 3)])
           for mo in sorted({m for m, _ in pairs}) for s in ("D_H", "I_T")]
    if any(sum(c) for _, _, c in rel):
        md += ["## Relevance of absent output objects (Tables 4-6)", "",
               md_table(["Model", "set", "Score 1", "Score 2", "Score 3"], [[m, s, *c] for m, s, c in rel]), ""]
    out = Path(args.out)

    def bars(fig, ax):
        x = np.arange(len(pairs))
        for i, name in enumerate(("hal_d", "hal_i", "exp", "chair_i")):
            ax.bar(x + (i - 1.5) * 0.2, [np.nan_to_num(metrics[f"{m}/{t}/{name}"]) for m, t in pairs], 0.2,
                   label=name)
        ax.set_xticks(x, [f"{m}\n{t}" for m, t in pairs], rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)

    plots = [("Hal-D, Hal-I, Exp and CHAIR_i per model and task", save_plot(out, "vope_rates.png", bars, (9, 4.5)))]
    write_outputs(out, metrics, md, plots)
    print(" ".join(f"{m}/{t}: hal_d={metrics[f'{m}/{t}/hal_d']:.3f} hal_i={metrics[f'{m}/{t}/hal_i']:.3f}"
                   for m, t in pairs[:3]))
    return 0
