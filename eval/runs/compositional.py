"""``run_compositional``: SugarCrepe-style compositional hard negatives: per category, the share of images whose
true caption an open_clip model scores above its negative caption (SugarCrepe's rule)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from halsift.corpus.config import ConfigError, field
from halsift.eval.result import EvalResult
from halsift.eval.runs.clip_model import ClipEvalSettings
from halsift.eval.runs.per_model import ModelScores


@dataclass
class CompositionalEvalConfig(ClipEvalSettings):
    data: str = field("", help="SugarCrepe category JSON ({id: {filename, caption, negative_caption}}, named "
                               "CATEGORY.json) or a folder of them")
    images: str = field("", help="the image folder the JSON filenames are relative to ('' = DATA's folder/images)")
    out: str = field("", help="writes metrics.json, report.md and sugarcrepe.json (SugarCrepe's result: "
                              "{category: accuracy 0-1}) here")

    def validate(self) -> None:
        super().validate()
        if not self.data:
            raise ValueError("data: required")


def evaluate_compositional(model, preprocess, tokenizer, pairs: dict, device="cpu", batch_size: int = 64,
                           precision: str = "auto", return_correct: bool = False):
    """``compositional/<category>`` and ``/mean`` (0-100) of a loaded model on the pairs of
    :func:`halsift.corpus.sugarcrepe.read_sugarcrepe`; each image is encoded once however many categories use it.
    With ``return_correct``, also the per-pair correctness per category."""
    from halsift.corpus.images import ImageDecodeError, load_image_file
    from halsift.corpus.sugarcrepe import SugarCrepeFormatError
    from halsift.eval.metrics.compositional import compositional_metrics, cosine_scores, pair_correct
    from halsift.eval.preprocess_memo import preprocessed
    from halsift.eval.runs.clip_model import encode_images, encode_texts, eval_mode

    paths = sorted({p.image for ps in pairs.values() for p in ps})
    index = {p: i for i, p in enumerate(paths)}

    def images():
        for p in paths:
            try:
                yield preprocessed(preprocess, p, partial(load_image_file, p))
            except ImageDecodeError as e:
                raise SugarCrepeFormatError(f"{p}: cannot read image ({e.reason})") from None

    texts = sorted({t for ps in pairs.values() for p in ps for t in (p.caption, p.negative)})
    tindex = {t: i for i, t in enumerate(texts)}  # a caption shared by several categories is encoded once
    correct = {}
    with eval_mode(model):
        img = encode_images(model, images(), device, batch_size, precision, total=len(paths), desc="compositional")
        txt = encode_texts(model, tokenizer, texts, device, batch_size, precision)
    for cat, ps in pairs.items():
        rows = img[[index[p.image] for p in ps]]
        pos, neg = txt[[tindex[p.caption] for p in ps]], txt[[tindex[p.negative] for p in ps]]
        correct[cat] = pair_correct(cosine_scores(rows, pos), cosine_scores(rows, neg))
    m = compositional_metrics(correct) | {"compositional/pairs": float(sum(len(ps) for ps in pairs.values()))}
    return (m, correct) if return_correct else m


def read_sets(sets: Mapping[str, str]) -> dict:
    """The SugarCrepe pairs by category of one folder (``{name: folder}``, as a recipe's ``data.compositional``),
    read and checked before any model; none: ``{}``."""
    from halsift.corpus.sugarcrepe import read_sugarcrepe

    if len(sets) > 1:
        raise ConfigError(f"compositional: one SugarCrepe folder at a time, got {sorted(sets)}")
    return read_sugarcrepe(next(iter(sets.values()))) if sets else {}


def evaluate_sets(model, preprocess, tokenizer, pairs: Mapping, device, batch_size: int,
                  precision: str) -> ModelScores:
    """A recipe's compositional evaluation of one loaded model: ``compositional/<category>`` and
    ``compositional/mean``, and per pair whether it is right (``compositional/<category>``)."""
    m, correct = evaluate_compositional(model, preprocess, tokenizer, pairs, device, batch_size, precision,
                                        return_correct=True)
    return ModelScores({k: v for k, v in m.items() if k != "compositional/pairs"},
                       {f"compositional/{c}": v for c, v in correct.items()})


def render_report(metrics: dict, model: str, pretrained: str, data: str) -> str:
    cats = [k.split("/", 1)[1] for k in metrics if k.count("/") == 1 and k not in ("compositional/mean",
                                                                                     "compositional/pairs")]
    lines = [f"# Compositional hard negatives (SugarCrepe): {model}", "", f"- weights: `{pretrained or 'random init'}`",
             f"- data: `{data}` ({int(metrics['compositional/pairs'])} pairs)", "",
             "Accuracy: share of pairs whose true caption scores above the negative (chance 50).", "",
             "| " + " | ".join([*cats, "mean"]) + " |", "|" + "---:|" * (len(cats) + 1),
             "| " + " | ".join(f"{metrics[f'compositional/{c}']:.1f}" for c in [*cats, "mean"]) + " |"]
    return "\n".join(lines) + "\n"


def run_compositional(config: CompositionalEvalConfig) -> EvalResult:
    """Score every pair and write ``metrics.json``, ``report.md`` and ``sugarcrepe.json``."""
    from halsift.corpus.atomic import write_text_atomic
    from halsift.corpus.shards import write_json_atomic
    from halsift.corpus.sugarcrepe import read_sugarcrepe
    from halsift.eval.metrics.compositional import sugarcrepe_result
    from halsift.eval.runs.clip_model import load_eval_model

    if not config.out:
        raise ConfigError("out: an output folder is required")
    pairs = read_sugarcrepe(config.data, config.images)
    model, preprocess, tokenizer, device = load_eval_model(config.model, config.pretrained, config.device)
    metrics = evaluate_compositional(model, preprocess, tokenizer, pairs, device, config.batch_size,
                                     config.precision)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "metrics.json", metrics)
    write_json_atomic(out / "sugarcrepe.json", sugarcrepe_result(metrics), indent=4)
    report = write_text_atomic(out / "report.md", render_report(metrics, config.model, config.pretrained,
                                                                str(config.data)))
    return EvalResult(dict(metrics), out, report, out / "metrics.json", files={"sugarcrepe": out / "sugarcrepe.json"},
                      summary=" ".join(f"{k.split('/', 1)[1]}={v:.1f}" for k, v in metrics.items()
                                       if k != "compositional/pairs"))
