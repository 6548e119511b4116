"""``run_vope``: Hal-D, Hal-I, Exp and CHAIR_i of vision-language models per task (VOPE), with report and plots.

Real data: recorded responses (``responses``) and an object vocabulary for extracting the objects a response
names (``vocab``, unless every row lists its ``objects``). The synthetic world's simulated responders are not part
of the library: :func:`halsift.synth.vope.synthetic_records` builds the same :class:`VopeRecords` from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field as dc_field
from pathlib import Path
from typing import Any

from halsift.corpus.config import ConfigError, field
from halsift.eval.result import EvalResult
from halsift.eval.source import check_source, resolve_data

UNPARSED = ("yes", "no", "exclude")
_NO_PUNCT = r"^\s*no\s*[.!,;:]"  # "No." / "No, ...": the official code reads these as yes; here they are no


@dataclass
class VopeEvalConfig:
    out: str = field("", help="output folder: metrics.json, report.md and plots/")
    synthetic: bool = field(False, help="simulated responders on synthetic scenes")
    images: int = field(100, range="[1, inf)", help="synthetic: images per task")
    seed: int = field(0, range="[0, inf)", help="synthetic: seed")
    responses: str = field("", help="recorded responses (JSONL): model, task, image_id, response, present, "
                                    "presence[, objects, relevance]")
    unparsed: str = field("yes", help="responses: a re-check reply that is neither yes nor no counts as yes (as the "
                                      "official code), as no, or is left out (exclude); counted either way")
    vocab: str = field("", help="object vocabulary (JSON {object: [synonyms]}) that finds the objects a response "
                                "names; needed unless every response lists its 'objects'")

    def validate(self) -> None:
        if self.unparsed not in UNPARSED:
            raise ValueError(f"unparsed: expected one of {UNPARSED}, got {self.unparsed!r}")
        check_source(self.synthetic, {"responses": self.responses}, "images", self.images)


@dataclass
class VopeRecords:
    """What the metrics are computed from: one :class:`halsift.eval.metrics.vope.VopeRecord` per response."""

    records: list
    source: str = ""  # one line for the report
    designed: dict | None = None  # (model, task) -> designed rates, shown beside the measured ones
    extra_metrics: dict[str, float] = dc_field(default_factory=dict)


def read_vocabulary(path: str) -> Any:
    """An :class:`~halsift.eval.metrics.vope.ObjectVocabulary` from a JSON file ``{object: [synonyms]}``."""
    import json

    from halsift.eval.metrics.vope import ObjectVocabulary

    try:
        with open(path, encoding="utf-8") as f:
            return ObjectVocabulary(json.load(f))
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"vocab: {path}: expected a JSON object {{object: [synonyms]}} ({e})") from None


def load_records(cfg: VopeEvalConfig) -> VopeRecords:
    """Records from the responses file: objects extracted with the vocabulary, re-check replies replayed."""
    import re

    from halsift.eval.metrics.vope import TableResponder, VopeRecord, classify, read_responses

    try:
        rows = read_responses(cfg.responses)
    except ValueError as e:
        raise ConfigError(f"responses: {e}") from None
    vocab = read_vocabulary(cfg.vocab) if cfg.vocab else None
    if vocab is None and any(not r.get("objects") for r in rows):
        raise ConfigError(f"vocab: {cfg.responses} has responses without an 'objects' list; give an object "
                          "vocabulary (JSON {object: [synonyms]}) to find the objects they name")
    default = {"yes": True, "no": False, "exclude": None}[cfg.unparsed]
    records, no_punct = [], 0
    for r in rows:
        objs = r.get("objects") or vocab.extract(r["response"])
        replay = TableResponder({r["image_id"]: r["presence"]})
        beliefs = {o: replay.is_present(r["image_id"], o) for o in objs}
        no_punct += sum(isinstance(r["presence"].get(o), str) and bool(re.match(_NO_PUNCT, r["presence"][o], re.I))
                        for o in objs)
        sets = classify(objs, beliefs, r["present"], default=default)
        records.append(VopeRecord(r["model"], r["task"], r["image_id"],
                                  {s: sets[s] for s in ("D_T", "D_H", "I_T", "I_H")}, sets["unparsed"],
                                  {o: int(v) for o, v in (r.get("relevance") or {}).items()
                                   if o in sets["D_H"] + sets["I_T"]}, sets.get("defaulted", [])))
    how = {"yes": "counted as yes (as the official code)", "no": "counted as no", "exclude": "left out"}
    source = (f"`{cfg.responses}`; re-check replies that are neither yes nor no: {how[cfg.unparsed]}"
              f"; {no_punct} replies like 'No.' read as no (the official code reads them as yes, a bug)")
    return VopeRecords(records, source, None, {"parse/no_punct_replies": float(no_punct)})


def _report(metrics: dict, data: VopeRecords, pairs: list, n_responses: int) -> list[str]:
    from halsift.eval.report.markdown import fmt, md_table

    designed = data.designed
    header = ["Model", "Task", "#D_T", "#D_H", "#I_T", "#I_H", "Hal-D ↓", "Hal-I ↓", "Exp", "CHAIR_i"]
    rows = []
    for mo, t in pairs:
        k = f"{mo}/{t}"
        cells = [mo, t] + [int(metrics[f"{k}/n/{s}"]) for s in ("D_T", "D_H", "I_T", "I_H")]
        for name in ("hal_d", "hal_i", "exp", "chair_i"):
            v = fmt(metrics[f"{k}/{name}"], 1)
            cells.append(f"{v} ({fmt(designed[(mo, t)][name], 1)})" if designed else v)
        rows.append(cells)
    md = ["# VOPE report", "", f"Source: {data.source}; {n_responses} responses.",
          "Hal-D = |D_H|/(|D_T|+|D_H|), Hal-I = |I_H|/(|I_T|+|I_H|), Exp = (|I_T|+|I_H|)/all, "
          "CHAIR_i = (|D_H|+|I_T|)/all, all in %." + (" Designed values in parentheses." if designed else ""),
          "",
          "## Metrics per model and task (Table 1)", "", md_table(header, rows), ""]
    rel = [(mo, s, [int(metrics.get(f"{mo}/all/relevance/{s}/{k}", 0)) for k in (1, 2, 3)])
           for mo in sorted({m for m, _ in pairs}) for s in ("D_H", "I_T")]
    if any(sum(c) for _, _, c in rel):
        md += ["## Relevance of absent output objects (Tables 4-6)", "",
               md_table(["Model", "set", "Score 1", "Score 2", "Score 3"], [[m, s, *c] for m, s, c in rel]), ""]
    return md


def _plot(out: Path, metrics: dict, pairs: list) -> tuple[str, Path]:
    import numpy as np

    from halsift.eval.report.outputs import save_plot

    def bars(fig, ax):
        x = np.arange(len(pairs))
        for i, name in enumerate(("hal_d", "hal_i", "exp", "chair_i")):
            ax.bar(x + (i - 1.5) * 0.2, [np.nan_to_num(metrics[f"{m}/{t}/{name}"]) for m, t in pairs], 0.2,
                   label=name)
        ax.set_xticks(x, [f"{m}\n{t}" for m, t in pairs], rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, 100)
        ax.set_ylabel("%")
        ax.legend(fontsize=7)

    return "Hal-D, Hal-I, Exp and CHAIR_i per model and task", save_plot(out, "vope_rates.png", bars, (9, 4.5))


def run_vope(config: VopeEvalConfig, data: VopeRecords | None = None) -> EvalResult:
    """Compute the VOPE metrics and write ``metrics.json``, ``report.md`` and plots to ``config.out``.

    ``data``: records built elsewhere (the synthetic world's); by default those of ``config.responses``.
    """
    from halsift.eval.report.outputs import write_outputs
    from halsift.eval.metrics.vope import records_frame, vope_metrics

    data = resolve_data(config, data, load_records, "halsift.synth.vope.synthetic_records")
    metrics = vope_metrics(data.records)
    metrics.update(data.extra_metrics)
    pairs = sorted({(r.model, r.task) for r in data.records})
    out = Path(config.out)
    md = _report(metrics, data, pairs, len(records_frame(data.records)))
    result = write_outputs(out, metrics, md, [_plot(out, metrics, pairs)])
    result.summary = " ".join(f"{m}/{t}: hal_d={metrics[f'{m}/{t}/hal_d']:.1f}% hal_i={metrics[f'{m}/{t}/hal_i']:.1f}%"
                              for m, t in pairs[:3])
    return result
