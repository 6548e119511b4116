"""``halsift eval retrieval``: R@1/5/10 image->text and text->image of an open_clip model on a retrieval set."""

from __future__ import annotations

import argparse

HELP = "image<->text retrieval recall (R@1/5/10, both directions) of an open_clip model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="ARCH", help="open_clip architecture (or halsift-tiny)")
    parser.add_argument("--pretrained", default="", metavar="TAG|PATH",
                        help="pretrained tag or weights file (e.g. RUN/final/open_clip_model.safetensors)")
    parser.add_argument("--data", required=True, metavar="DIR|JSONL", help="retrieval set: retrieval.jsonl or its folder")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="writes metrics.json, report.md and clip_benchmark.json (CLIP_benchmark's result layout, "
                             "for `clip_benchmark build`) here")
    parser.add_argument("--batch-size", type=int, default=64, help="encoding batch size (default: 64)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (default: auto)")


def render_report(metrics: dict, model: str, pretrained: str, data: str) -> str:
    """A markdown table of R@k in both directions."""
    ks = sorted({int(k.split("@")[1]) for k in metrics if "/r@" in k})
    lines = [f"# Retrieval: {model}", "", f"- weights: `{pretrained or 'random init'}`", f"- data: `{data}` "
             f"({int(metrics.get('retrieval/images', 0))} images, {int(metrics.get('retrieval/captions', 0))} captions)",
             "", "| direction | " + " | ".join(f"R@{k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for d, name in (("i2t", "image → text"), ("t2i", "text → image")):
        lines.append(f"| {name} | " + " | ".join(f"{metrics[f'{d}/r@{k}']:.1f}" for k in ks) + " |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from halsift.launch.cli import UsageError

    if args.batch_size < 1:
        raise UsageError(f"--batch-size: must be >= 1, got {args.batch_size}")
    if args.pretrained and os.sep in args.pretrained and not os.path.isfile(args.pretrained):
        raise FileNotFoundError(f"--pretrained: {args.pretrained} is not a file")
    from halsift.corpus.retrieval import read_retrieval

    read_retrieval(args.data)  # validate the set (errors name file:line:field) before building the model
    import open_clip
    import torch

    from halsift.corpus.shards import write_json_atomic
    from halsift.eval.retrieval import evaluate_retrieval, retrieval_set_name, write_clip_benchmark
    from halsift.training.clip_config import check_model_name

    try:
        check_model_name(args.model)
    except ValueError as e:
        raise UsageError(f"--{e}") from None
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    from halsift.training.clip_train import load_model

    model, _, preprocess = load_model(args.model, args.pretrained or None, device=device)
    tokenizer = open_clip.get_tokenizer(args.model)
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=device != "cpu"):
        metrics = evaluate_retrieval(model, preprocess, tokenizer, args.data, device, args.batch_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "metrics.json", metrics)
    write_clip_benchmark(out / "clip_benchmark.json", metrics, retrieval_set_name(args.data), args.model,
                         args.pretrained)
    tmp = out / f".report.md.tmp{os.getpid()}"
    tmp.write_text(render_report(metrics, args.model, args.pretrained, str(args.data)), encoding="utf-8")
    os.replace(tmp, out / "report.md")
    print(" ".join(f"{k}={v:.1f}" for k, v in metrics.items() if "/r@" in k))
    return 0
