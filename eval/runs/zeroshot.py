"""``run_zeroshot``: zero-shot classification (top-1 / top-5 accuracy, mean per-class recall) of an open_clip model
on a CLIP_benchmark wds folder or an ImageFolder, computed as CLIP_benchmark computes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from halsift.corpus.config import ConfigError, field
from halsift.eval.result import EvalResult
from halsift.eval.runs.clip_model import ClipEvalSettings
from halsift.eval.runs.per_model import ModelScores

METRICS = ("acc1", "acc5", "mean_per_class_recall")


@dataclass
class ZeroshotEvalConfig(ClipEvalSettings):
    data: str = field("", help="a CLIP_benchmark wds folder (SPLIT/nshards.txt, SPLIT/*.tar, classnames.txt, "
                               "zeroshot_classification_templates.txt) or an ImageFolder (one folder per class)")
    out: str = field("", help="writes metrics.json, report.md and clip_benchmark.json (CLIP_benchmark's result "
                              "layout) here")
    split: str = field("test", help="wds: the split folder to evaluate")
    classnames: str = field("", help="class names file, one per line ('' = DATA/classnames.txt; an ImageFolder "
                                     "without one uses its folder names)")
    templates: str = field("", help="prompt templates file, one per line with {c} ('' = "
                                    "DATA/zeroshot_classification_templates.txt)")

    def validate(self) -> None:
        super().validate()
        if not self.data:
            raise ValueError("data: required")


def evaluate_zeroshot(model, preprocess, tokenizer, cset, device="cpu", batch_size: int = 64,
                      precision: str = "auto", return_logits: bool = False):
    """Zero-shot metrics (``zeroshot/acc1`` ... 0-100, ``zeroshot/images``, ``zeroshot/classes``) of a loaded model
    on a :class:`~halsift.corpus.classification.ClassificationSet`; with ``return_logits``, also
    ``(logits, target)``."""
    from halsift.corpus.classification import open_image
    from halsift.eval.metrics.zeroshot import class_embedding, zeroshot_logits, zeroshot_metrics
    from halsift.eval.preprocess_memo import preprocessed
    from halsift.eval.runs.clip_model import encode_images, encode_texts, eval_mode

    target: list[int] = []

    def images():
        for name, item, label in cset.iter_items():
            target.append(label)
            yield preprocessed(preprocess, (cset.root, name), partial(open_image, item, name))

    with eval_mode(model):
        weights = [class_embedding(encode_texts(model, tokenizer, cset.prompts(c), device, batch_size, precision))
                   for c in cset.classnames]
        img = encode_images(model, images(), device, batch_size, precision, desc=f"zeroshot {cset.name}")
    if not target:
        raise ConfigError(f"data: {cset.root} holds no images")
    logits = zeroshot_logits(img, np.stack(weights, axis=1))
    m = {f"zeroshot/{k}": v for k, v in zeroshot_metrics(logits, target, len(cset.classnames)).items()}
    m |= {"zeroshot/images": float(len(target)), "zeroshot/classes": float(len(cset.classnames))}
    return (m, logits, np.asarray(target)) if return_logits else m


def read_sets(sets: Mapping[str, str]) -> dict:
    """The classification sets by task name (each a folder of :func:`halsift.corpus.classification
    .read_classification`), read and checked before any model."""
    from halsift.corpus.classification import read_classification

    return {name: read_classification(path) for name, path in sets.items()}


def evaluate_sets(model, preprocess, tokenizer, tasks: Mapping, device, batch_size: int,
                  precision: str) -> ModelScores:
    """A recipe's zero-shot classification of one loaded model on every task: ``zeroshot/<task>/<measure>``, their
    mean over tasks ``zeroshot/<measure>`` (``acc5`` over the tasks with >= 5 classes), and per image whether its
    top-1 class is right (``zeroshot/<task>``)."""
    out = ModelScores({})
    for name, cset in tasks.items():
        m, logits, target = evaluate_zeroshot(model, preprocess, tokenizer, cset, device, batch_size, precision,
                                              return_logits=True)
        out.metrics |= {f"zeroshot/{name}/{k}": m[f"zeroshot/{k}"] for k in METRICS}
        out.arrays[f"zeroshot/{name}"] = logits.argmax(axis=1) == target
    for k in METRICS:
        vals = [out.metrics[f"zeroshot/{t}/{k}"] for t in tasks if np.isfinite(out.metrics[f"zeroshot/{t}/{k}"])]
        if vals:
            out.metrics[f"zeroshot/{k}"] = float(np.mean(vals))
    return out


def render_report(metrics: dict, model: str, pretrained: str, data: str) -> str:
    """A markdown table of the three measures."""
    cells = [f"{metrics[f'zeroshot/{k}']:.1f}" if np.isfinite(metrics[f"zeroshot/{k}"]) else "– (< 5 classes)"
             for k in METRICS]
    return "\n".join([f"# Zero-shot classification: {model}", "", f"- weights: `{pretrained or 'random init'}`",
                      f"- data: `{data}` ({int(metrics['zeroshot/images'])} images, "
                      f"{int(metrics['zeroshot/classes'])} classes)", "",
                      "| top-1 acc | top-5 acc | mean per-class recall |", "|---:|---:|---:|",
                      "| " + " | ".join(cells) + " |"]) + "\n"


def run_zeroshot(config: ZeroshotEvalConfig) -> EvalResult:
    """Classify the set's images zero-shot and write ``metrics.json``, ``report.md`` and ``clip_benchmark.json``."""
    from halsift.corpus.atomic import write_text_atomic
    from halsift.corpus.classification import read_classification
    from halsift.corpus.shards import write_json_atomic
    from halsift.eval.metrics.zeroshot import clip_benchmark_result
    from halsift.eval.runs.clip_model import load_eval_model

    if not config.out:
        raise ConfigError("out: an output folder is required")
    cset = read_classification(config.data, config.split, config.classnames, config.templates)
    model, preprocess, tokenizer, device = load_eval_model(config.model, config.pretrained, config.device)
    metrics = evaluate_zeroshot(model, preprocess, tokenizer, cset, device, config.batch_size, config.precision)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "metrics.json", {k: v for k, v in metrics.items() if np.isfinite(v)})
    write_json_atomic(out / "clip_benchmark.json", clip_benchmark_result(metrics, f"wds/{cset.name}", config.model,
                                                                         config.pretrained), indent=None)
    report = write_text_atomic(out / "report.md", render_report(metrics, config.model, config.pretrained,
                                                                str(config.data)))
    return EvalResult(dict(metrics), out, report, out / "metrics.json",
                      files={"clip_benchmark": out / "clip_benchmark.json"},
                      summary=" ".join(f"{k}={metrics[f'zeroshot/{k}']:.1f}" for k in METRICS))
