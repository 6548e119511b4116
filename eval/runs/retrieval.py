"""``run_retrieval``: R@1/5/10 image->text and text->image of an open_clip model on a retrieval set."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal
from pathlib import Path

from halsift.corpus.config import ConfigError, field
from halsift.eval.result import EvalResult


@dataclass
class RetrievalEvalConfig:
    model: str = field("", help="open_clip architecture (or halsift-tiny)")
    pretrained: str = field("", help="pretrained tag or weights file (e.g. RUN/final/open_clip_model.safetensors)")
    data: str = field("", help="retrieval set: retrieval.jsonl or its folder")
    out: str = field("", help="writes metrics.json, report.md and clip_benchmark.json (CLIP_benchmark's result "
                              "layout, for `clip_benchmark build`) here")
    batch_size: int = field(64, help="encoding batch size")
    device: str = field("auto", help="auto | cpu | cuda[:N]")
    precision: Literal["auto", "bf16", "fp32"] = field("auto", help="auto: bf16 autocast on a GPU, fp32 on a CPU "
                                                                      "(the same rule as training's in-loop eval)")

    def validate(self) -> None:
        for name in ("model", "data"):
            if not getattr(self, name):
                raise ValueError(f"{name}: required")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.pretrained and os.sep in self.pretrained and not os.path.isfile(self.pretrained):
            raise ValueError(f"pretrained: {self.pretrained} is not a file")


def render_report(metrics: dict, model: str, pretrained: str, data: str) -> str:
    """A markdown table of R@k in both directions."""
    ks = sorted({int(k.split("@")[1]) for k in metrics if "/r@" in k})
    lines = [f"# Retrieval: {model}", "", f"- weights: `{pretrained or 'random init'}`", f"- data: `{data}` "
             f"({int(metrics.get('retrieval/images', 0))} images, {int(metrics.get('retrieval/captions', 0))} captions)",
             "", "| direction | " + " | ".join(f"R@{k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for d, name in (("i2t", "image → text"), ("t2i", "text → image")):
        lines.append(f"| {name} | " + " | ".join(f"{metrics[f'{d}/r@{k}']:.1f}" for k in ks) + " |")
    return "\n".join(lines) + "\n"


def run_retrieval(config: RetrievalEvalConfig) -> EvalResult:
    """Encode the retrieval set with the model and write ``metrics.json``, ``report.md`` and
    ``clip_benchmark.json`` to ``config.out``."""
    from halsift.corpus.retrieval import read_retrieval

    if not config.out:
        raise ConfigError("out: an output folder is required")
    read_retrieval(config.data)  # validate the set (errors name file:line:field) before building the model
    import open_clip
    import torch
    from safetensors import SafetensorError

    from halsift.corpus.atomic import write_text_atomic
    from halsift.corpus.percent import mark_percent
    from halsift.corpus.shards import write_json_atomic
    from halsift.eval.metrics.retrieval import evaluate_retrieval, retrieval_set_name, write_clip_benchmark
    from halsift.filtering.models.clip_models import SCHEMAS, load_open_clip, register_builtin_configs
    from halsift.filtering.models.clip_tokenizer import get_tokenizer

    register_builtin_configs()
    if not config.model.startswith(SCHEMAS) and config.model not in open_clip.list_models():
        raise ConfigError(f"model: {config.model!r} is not an open_clip architecture; see open_clip.list_models()")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if config.device == "auto" else config.device
    try:
        model, _, preprocess = load_open_clip(config.model, config.pretrained or None, device=device)
    except SafetensorError as e:
        raise SafetensorError(f"pretrained: {e}") from None
    tokenizer = get_tokenizer(config.model)
    metrics = evaluate_retrieval(model, preprocess, tokenizer, config.data, device, config.batch_size,
                                 precision=config.precision)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "metrics.json", mark_percent(metrics))  # R@k: percentages
    write_clip_benchmark(out / "clip_benchmark.json", metrics, retrieval_set_name(config.data), config.model,
                         config.pretrained)
    report = write_text_atomic(out / "report.md", render_report(metrics, config.model, config.pretrained,
                                                                str(config.data)))
    return EvalResult(dict(metrics), out, report, out / "metrics.json",
                      files={"clip_benchmark": out / "clip_benchmark.json"},
                      summary=" ".join(f"{k}={v:.1f}" for k, v in metrics.items() if "/r@" in k))
