"""`eval retrieval` writes CLIP_benchmark's result JSON; clip_benchmark's own `build` aggregates it."""

from __future__ import annotations

import argparse
import json
import random

import pandas as pd
import pytest
from filtering_data import png

from halsift.corpus.retrieval import write_retrieval
from halsift.eval.metrics.retrieval import clip_benchmark_result
from halsift.launch.cli import main


def test_result_layout_and_scale():
    r = clip_benchmark_result({"i2t/r@1": 20.0, "i2t/r@5": 60.0, "t2i/r@1": 10.0, "t2i/r@5": 50.0, "i2t/mean_r": 40.0},
                              "coco", "ViT-B-32", "")
    assert r == {"dataset": "coco", "model": "ViT-B-32", "pretrained": "random-init", "task": "zeroshot_retrieval",
                 "language": "en", "metrics": {"image_retrieval_recall@1": 0.1, "text_retrieval_recall@1": 0.2,
                                               "image_retrieval_recall@5": 0.5, "text_retrieval_recall@5": 0.6}}


def test_eval_retrieval_output_aggregates_with_clip_benchmark_build(tmp_path):
    rng = random.Random(0)
    rows = []
    (tmp_path / "flickr_mini").mkdir()
    for i in range(6):
        (tmp_path / "flickr_mini" / f"{i}.png").write_bytes(png(rng))
        rows.append({"image": f"{i}.png", "captions": [f"A picture number {i}.", f"Another view {i}."]})
    write_retrieval(tmp_path / "flickr_mini" / "retrieval.jsonl", rows)
    outs, expected = [], []
    for name in ("a", "b"):
        out = tmp_path / name
        assert main(["eval", "retrieval", "--model", "halsift-tiny", "--data", str(tmp_path / "flickr_mini"),
                     "--out", str(out), "--device", "cpu"]) == 0
        ours = json.loads((out / "metrics.json").read_text())
        cb = json.loads((out / "clip_benchmark.json").read_text())
        assert cb["dataset"] == "flickr_mini" and cb["pretrained"] == "random-init"
        assert cb["metrics"]["text_retrieval_recall@5"] == pytest.approx(ours["i2t/r@5"] / 100)
        assert cb["metrics"]["image_retrieval_recall@10"] == pytest.approx(ours["t2i/r@10"] / 100)
        outs.append(out / "clip_benchmark.json")
        expected.append(ours["i2t/r@5"] / 100)
    cli = pytest.importorskip("clip_benchmark.cli")
    csv = tmp_path / "benchmark.csv"
    cli.main_build(argparse.Namespace(files=[str(p) for p in outs], output=str(csv)))
    df = pd.read_csv(csv)
    assert len(df) == 2 and set(df["model_fullname"]) == {"halsift-tiny random-init"}
    assert sorted(df["text_retrieval_recall@5"]) == pytest.approx(sorted(expected))
