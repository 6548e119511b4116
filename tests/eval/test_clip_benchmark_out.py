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


# the fields clip_benchmark 1.6's `eval` dumps for a retrieval task (clip_benchmark/cli.py, run(): ``dump``)
CB_FIELDS = {"dataset", "model", "pretrained", "task", "metrics", "language"}


def _build(files: list, output) -> None:
    """clip_benchmark 1.6's ``main_build`` (clip_benchmark/cli.py, MIT), restated so CI checks our files against
    what `clip_benchmark build` does with them when the optional extra is not installed: each file's metrics and
    top-level fields become one CSV row, plus ``model_fullname`` = ``model + ' ' + pretrained``."""
    import csv

    rows, fieldnames = [], set()
    for path in files:
        data = json.loads(open(path).read())
        row = {**data["metrics"], **data}
        del row["metrics"]
        row["model_fullname"] = row["model"] + " " + row["pretrained"]
        fieldnames |= set(row)
        rows.append(row)
    with open(output, "w") as f:
        writer = csv.DictWriter(f, fieldnames=sorted(fieldnames))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[list[str], list[dict]]:
    """Two `eval retrieval` runs of halsift-tiny on a 6-image set: their clip_benchmark.json paths and metrics."""
    tmp = tmp_path_factory.mktemp("cb")
    rng = random.Random(0)
    rows = []
    (tmp / "flickr_mini").mkdir()
    for i in range(6):
        (tmp / "flickr_mini" / f"{i}.png").write_bytes(png(rng))
        rows.append({"image": f"{i}.png", "captions": [f"A picture number {i}.", f"Another view {i}."]})
    write_retrieval(tmp / "flickr_mini" / "retrieval.jsonl", rows)
    outs, ours = [], []
    for name in ("a", "b"):
        out = tmp / name
        assert main(["eval", "retrieval", "--model", "halsift-tiny", "--pretrained", "random", "--data",
                     str(tmp / "flickr_mini"),
                     "--out", str(out), "--device", "cpu"]) == 0
        outs.append(str(out / "clip_benchmark.json"))
        ours.append(json.loads((out / "metrics.json").read_text()))
    return outs, ours


def test_eval_retrieval_output_has_clip_benchmark_layout_and_builds(two_runs, tmp_path):
    """Runs without the optional extra: the files hold what clip_benchmark's eval dumps, and its build (restated
    in :func:`_build`) makes one row per run with our recalls on its scale."""
    outs, ours = two_runs
    for path, m in zip(outs, ours):
        cb = json.loads(open(path).read())
        assert set(cb) == CB_FIELDS and (cb["task"], cb["language"]) == ("zeroshot_retrieval", "en")
        assert (cb["dataset"], cb["model"], cb["pretrained"]) == ("flickr_mini", "halsift-tiny", "random-init")
        # clip_benchmark's names and 0-1 scale: image_retrieval = text->image, text_retrieval = image->text
        want = {f"{a}_retrieval_recall@{k}": m[f"{b}/r@{k}"] / 100
                for a, b in (("image", "t2i"), ("text", "i2t")) for k in (1, 5, 10)}
        assert cb["metrics"] == pytest.approx(want)
    csv = tmp_path / "benchmark.csv"
    _build(outs, csv)
    df = pd.read_csv(csv)
    assert len(df) == 2 and set(df["model_fullname"]) == {"halsift-tiny random-init"}
    assert set(df["task"]) == {"zeroshot_retrieval"} and set(df["dataset"]) == {"flickr_mini"}
    for k in ("i2t/r@1", "i2t/r@5", "t2i/r@10"):
        col = f"{'text' if k.startswith('i2t') else 'image'}_retrieval_recall@{k.split('@')[1]}"
        assert df[col].tolist() == pytest.approx([m[k] / 100 for m in ours]), k


def test_clip_benchmark_build_itself_gives_the_same_table(two_runs, tmp_path):
    """With the optional extra installed: `clip_benchmark build` on our files equals :func:`_build`'s table."""
    cli = pytest.importorskip("clip_benchmark.cli")
    outs, _ = two_runs
    cli.main_build(argparse.Namespace(files=outs, output=str(tmp_path / "real.csv")))
    _build(outs, tmp_path / "ours.csv")
    real, ours = pd.read_csv(tmp_path / "real.csv"), pd.read_csv(tmp_path / "ours.csv")
    pd.testing.assert_frame_equal(real.sort_index(axis=1), ours.sort_index(axis=1))
    assert sorted(real["text_retrieval_recall@5"]) == pytest.approx(
        sorted(json.loads(open(p).read())["metrics"]["text_retrieval_recall@5"] for p in outs))
