"""``run_vigil``: the VIGIL pipeline (object mutation, background inconsistency, object omission) with the
leave-one-category-out grid search, multi-label F1 per type and category, trivial baselines, report and plots.

Real data: VIGIL annotation files, analysed with the settings' vocabulary (default: the prompt's words),
segmenter and encoder (a colour/shape embedding, or an open_clip image tower). The synthetic composites are not
part of the library: :func:`halsift.synth.vigil.synthetic_inputs` builds the same :class:`VigilInputs` from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halsift.corpus.config import ConfigError, field
from halsift.eval.result import EvalResult
from halsift.eval.source import check_source, resolve_data

ENCODERS = ("colour-shape", "open_clip")


@dataclass
class VigilEvalConfig:
    out: str = field("", help="output folder: metrics.json, report.md, findings.jsonl and plots/")
    synthetic: bool = field(False, help="synthetic composites in 5 product categories (with the synthetic world's "
                                        "vocabulary, segmenter and encoder)")
    per_category: int = field(30, range="[1, inf)", help="synthetic: records per category")
    seed: int = field(0, range="[0, inf)", help="synthetic: seed")
    annotations: str = field("", help="VIGIL annotation file (JSON list of {generated_photo, hallucination})")
    root: str = field("", help="folder the annotation's image paths are relative to ('' = the file's folder)")
    vocab: str = field("", help="object names the prompts are searched for: a JSON list, or {object: [synonyms]} "
                                "(its keys) ('' = every prompt word that is not a stop word)")
    min_saturation: float = field(0.35, range="[0, 1)",
                                  help="segmenter: pixels more saturated than this are object pixels")
    min_area: int = field(20, range="[1, inf)", help="segmenter: smallest object (connected pixels)")
    encoder: str = field("colour-shape", help="object crop embedding: colour-shape (colour histogram + silhouette) "
                                              "| open_clip (the image tower of clip_arch / clip_pretrained)")
    clip_arch: str = field("", help="encoder open_clip: architecture (e.g. ViT-B-32)")
    clip_pretrained: str = field("", help="encoder open_clip: pretrained tag or weights file")
    device: str = field("cpu", help="encoder open_clip: cpu | cuda[:N]")

    def validate(self) -> None:
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder: expected one of {ENCODERS}, got {self.encoder!r}")
        if self.encoder == "open_clip" and not self.clip_arch:
            raise ValueError("clip_arch: required with encoder open_clip")
        check_source(self.synthetic, {"annotations": self.annotations}, "per_category", self.per_category)


@dataclass
class VigilInputs:
    """Records and the pipeline's stages: the vocabulary, :class:`~halsift.eval.metrics.vigil.Segmenter` and
    :class:`~halsift.eval.metrics.vigil.ImageEncoder`."""

    records: list
    vocabulary: tuple[str, ...]
    segmenter: Any
    encoder: Any
    source: str = ""  # one line for the report


def read_vocabulary(path: str) -> tuple[str, ...]:
    """Object names from a JSON list or the keys of a JSON object."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"vocab: {path}: cannot read it ({e})") from None
    names = list(data) if isinstance(data, (list, dict)) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"vocab: {path}: expected a JSON list of object names or {{object: [synonyms]}}")
    return tuple(names)


def make_encoder(cfg: VigilEvalConfig) -> Any:
    """The configured :class:`~halsift.eval.metrics.vigil.ImageEncoder`."""
    from halsift.eval.metrics.vigil import ColourShapeEncoder, OpenClipEncoder

    if cfg.encoder == "colour-shape":
        return ColourShapeEncoder()
    from halsift.filtering.models.clip_models import load_open_clip

    model, _, preprocess = load_open_clip(cfg.clip_arch, cfg.clip_pretrained or None, device=cfg.device)
    return OpenClipEncoder(model.eval(), preprocess, cfg.device)


def load_inputs(cfg: VigilEvalConfig) -> VigilInputs:
    """The annotation file's records with the configured vocabulary, segmenter and encoder."""
    from halsift.eval.metrics.vigil import ColourSegmenter, VigilFormatError, read_vigil

    try:
        records = read_vigil(cfg.annotations, cfg.root or None)
    except VigilFormatError as e:
        raise ConfigError(f"annotations: {e}") from None
    bad = [r.id for r in records if r.background is None or not r.references]
    if bad:
        raise ConfigError(f"annotations: records {', '.join(bad[:3])} lack background_photo/object_photos")
    vocab = read_vocabulary(cfg.vocab) if cfg.vocab else ()
    return VigilInputs(records, vocab, ColourSegmenter(cfg.min_saturation, cfg.min_area), make_encoder(cfg),
                       f"`{cfg.annotations}`")


def score_records(data: VigilInputs) -> tuple[dict, list, list, Any, Any]:
    """Analyse every record, run the LOCO search and compute F1 against the trivial baselines (F1 and
    ``prevalence/<type>`` in %, 0–100); returns (metrics, analyses, splits, labels, baselines)."""
    import numpy as np

    from halsift.corpus.percent import percent
    from halsift.corpus.progress import progress
    from halsift.eval.metrics.vigil import TYPES, analyze, label_matrix, loco_search, multilabel_f1

    records = data.records
    analyses = [analyze(r, data.segmenter, data.encoder, data.vocabulary)
                for r in progress(records, desc="vigil", unit="rec")]
    y = label_matrix([r.labels for r in records])
    cats = [r.category for r in records]
    pred, splits = loco_search(analyses, y, cats)
    metrics = multilabel_f1(y, pred, cats)
    baselines = {"always-present": np.ones_like(y), "never-present": np.zeros_like(y)}
    for name, p in baselines.items():
        metrics.update({f"baseline/{name}/{k[3:]}": v for k, v in multilabel_f1(y, p, cats).items()})
    metrics["records"] = len(records)
    for k, t in enumerate(TYPES):
        metrics[f"prevalence/{t}"] = percent(y[:, k].mean())
    return metrics, analyses, splits, y, baselines


def write_findings(path: Path, records: list, analyses: list, splits: list) -> Path:
    """``findings.jsonl``: each record's flags and explanations under its category's chosen parameters."""
    import json

    from halsift.corpus.atomic import atomic_file
    from halsift.eval.metrics.vigil import VigilConfig, decide

    cfg_by_cat = {s["category"]: s["config"] for s in splits}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for r, a in zip(records, analyses):
            fnd = decide(a, VigilConfig(**cfg_by_cat[r.category]))
            f.write(json.dumps({**fnd.to_json(), "category": r.category, "labels": r.labels}) + "\n")
    return path


def _report(metrics: dict, splits: list, methods: dict, records: list, source: str) -> list[str]:
    from halsift.eval.report.markdown import fmt, md_table
    from halsift.eval.metrics.vigil import TYPES

    cfg_by_cat = {s["category"]: s["config"] for s in splits}
    rows = [[m] + [fmt(metrics[f"{pre}/{t}"], 1) for t in (*TYPES, "macro", "macro_categories")]
            for m, pre in methods.items()]
    cats_sorted = sorted({r.category for r in records})
    return ["# VIGIL report", "", f"Source: {source}; {len(records)} records. Multi-label F1 (%) per type (sklearn, "
            "zero_division=0), macro over types and over categories; parameters chosen leave-one-category-out.", "",
            "## F1 per hallucination type", "",
            md_table(["Method", *TYPES, "macro", "macro over categories"], rows), "",
            "## Macro F1 per category (held out)", "",
            md_table(["Category", "macro F1", "always-present", "chosen tau / margin / boxes", "train macro F1"],
                     [[c, fmt(metrics[f"f1/{c}/macro"], 1), fmt(metrics[f"baseline/always-present/{c}/macro"], 1),
                       f"{cfg_by_cat[c]['tau']} / {cfg_by_cat[c]['margin']} / {cfg_by_cat[c]['boxes']}",
                       fmt(next(s['train_f1'] for s in splits if s['category'] == c), 1)] for c in cats_sorted]), "",
            "Per-record findings with explanations: `findings.jsonl`.", ""]


def _plot(out: Path, metrics: dict, methods: dict) -> tuple[str, Path]:
    import numpy as np

    from halsift.eval.report.outputs import save_plot
    from halsift.eval.metrics.vigil import TYPES

    def bars(fig, ax):
        x = np.arange(len(TYPES) + 1)
        for i, (m, pre) in enumerate(methods.items()):
            ax.bar(x + (i - 1) * 0.27, [metrics[f"{pre}/{t}"] for t in (*TYPES, "macro")], 0.27, label=m)
        ax.set_xticks(x, [*TYPES, "macro"])
        ax.set_ylim(0, 100)
        ax.set_ylabel("F1 (%)")
        ax.legend(fontsize=7)

    return "F1 per type: pipeline vs trivial baselines", save_plot(out, "vigil_f1.png", bars)


def run_vigil(config: VigilEvalConfig, data: VigilInputs | None = None) -> EvalResult:
    """Run the pipeline and write ``metrics.json``, ``report.md``, ``findings.jsonl`` and plots to ``config.out``.

    ``data``: records and stages built elsewhere (the synthetic world's); by default the annotation file's with
    the configured stages.
    """
    from halsift.eval.report.outputs import write_outputs

    data = resolve_data(config, data, load_inputs, "halsift.synth.vigil.synthetic_inputs")
    metrics, analyses, splits, _, baselines = score_records(data)
    out = Path(config.out)
    findings = write_findings(out / "findings.jsonl", data.records, analyses, splits)
    methods = {"VIGIL pipeline (LOCO)": "f1", **{f"{n} baseline": f"baseline/{n}" for n in baselines}}
    result = write_outputs(out, metrics, _report(metrics, splits, methods, data.records, data.source),
                           [_plot(out, metrics, methods)], findings=findings)
    result.summary = (f"macro F1 {metrics['f1/macro']:.1f}% (always-present "
                      f"{metrics['baseline/always-present/macro']:.1f}%, never-present "
                      f"{metrics['baseline/never-present/macro']:.1f}%)")
    return result
