"""``run_retrieval``: R@1/5/10 image->text and text->image of an open_clip model on a retrieval set."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.config import ConfigError, field
from halsift.eval.result import EvalResult
from halsift.eval.runs.clip_model import ClipEvalSettings
from halsift.eval.runs.per_model import ModelScores


@dataclass
class RetrievalEvalConfig(ClipEvalSettings):
    data: str = field("", help="retrieval set: retrieval.jsonl or its folder")
    out: str = field("", help="writes metrics.json, report.md and clip_benchmark.json (CLIP_benchmark's result "
                              "layout, for `clip_benchmark build`) here")

    def validate(self) -> None:
        super().validate()
        if not self.data:
            raise ValueError("data: required")


def read_sets(sets: Mapping[str, str]) -> dict[str, str]:
    """The retrieval sets by name, each read and checked (errors name file:line:field) before any model."""
    from halsift.corpus.retrieval import read_retrieval

    for path in sets.values():
        read_retrieval(path)
    return dict(sets)


def evaluate_sets(model, preprocess, tokenizer, sets: Mapping[str, str], device, batch_size: int,
                  precision: str) -> ModelScores:
    """A recipe's retrieval of one loaded model on every set: ``<set>/<i2t|t2i>/r@k`` (and the set's
    ``retrieval/images|captions``), the per-query ranks ``<set>/<i2t|t2i>`` and, the same for every model, the set's
    caption -> image map ``<set>/text_to_image``."""
    from halsift.eval.metrics.retrieval import evaluate_retrieval

    out = ModelScores({})
    for set_name, path in sets.items():
        m, rk = evaluate_retrieval(model, preprocess, tokenizer, path, device, batch_size, return_ranks=True,
                                   precision=precision)
        out.metrics |= {f"{set_name}/{k}": v for k, v in m.items()}
        out.arrays |= {f"{set_name}/{d}": rk[d] for d in ("i2t", "t2i")}
        out.shared[f"{set_name}/text_to_image"] = rk["text_to_image"]
    return out


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
    from halsift.corpus.atomic import write_text_atomic
    from halsift.corpus.percent import mark_percent
    from halsift.corpus.shards import write_json_atomic
    from halsift.eval.metrics.retrieval import evaluate_retrieval, retrieval_set_name, write_clip_benchmark
    from halsift.eval.runs.clip_model import load_eval_model

    model, preprocess, tokenizer, device = load_eval_model(config.model, config.pretrained, config.device)
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
