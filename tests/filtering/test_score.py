"""The scoring runner: distributed equality, resume after SIGKILL, corrupt samples, manifests, bench scoring."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import UserDict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from filtering_data import free_port, make_bench, make_corpus, reshard
from scipy.stats import rankdata

from halsift.corpus.scores import read_scores_df
from halsift.filtering.scoring.parts import RunMismatch
from halsift.filtering.scoring.runner import score, score_bench
from halsift.launch.cli import main

ENV = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}


def _rows(folder) -> pd.DataFrame:
    df = read_scores_df(folder)[["key", "sentence_index", "score"]]
    assert not df.duplicated(["key", "sentence_index"]).any()
    return df.sort_values(["key", "sentence_index"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def world_shards(synth_world, tmp_path_factory):
    """The synthetic corpus split into 4 shards, so ranks have work to share."""
    return reshard(synth_world / "corpus", tmp_path_factory.mktemp("resharded"), maxcount=40)


def test_two_process_torchrun_matches_one_process(world_shards, tmp_path):
    spec = "clip:arch=halsift-tiny,pretrained=random,seed=0"
    score(spec, world_shards, tmp_path / "one", batch_size=16, device="cpu", show_progress=False)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "halsift.launch.cli", "score", "--detector", spec, "--data", str(world_shards),
           "--out", str(tmp_path / "two"), "--batch-size", "16", "--device", "cpu", "--no-progress"]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((tmp_path / "two" / "_manifest.json").read_text())
    assert m["world_size"] == 2 and m["ranks"] == [0, 1] and m["part_world_sizes"] == [2]
    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert len(one) == m["sentences"] > 100
    pd.testing.assert_frame_equal(one[["key", "sentence_index"]], two[["key", "sentence_index"]])
    np.testing.assert_allclose(one["score"], two["score"], atol=1e-4)


def test_sigkill_then_rerun_gives_identical_output(tmp_path):
    data = make_corpus(tmp_path / "c", shards=6, per_shard=5, seed=1)
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "halsift.launch.cli", "score", "--detector", "random:seed=0,delay=0.25",
           "--data", str(data), "--out", str(out), "--batch-size", "4", "--no-progress"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list(out.glob("part-*.parquet")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = list(out.glob("part-*.parquet"))
    assert 1 <= len(done) < 6, "the run should have been killed part-way"
    assert json.loads((out / "_manifest.json").read_text())["status"] == "running"
    assert subprocess.run(cmd, env=ENV, capture_output=True, timeout=120).returncode == 0
    m = json.loads((out / "_manifest.json").read_text())
    assert m["status"] == "complete" and m["parts_resumed"] == len(done)
    score("random:seed=0", data, tmp_path / "clean", batch_size=4, show_progress=False)
    pd.testing.assert_frame_equal(_rows(out), _rows(tmp_path / "clean"))


def test_corrupt_samples_are_skipped_and_counted(tmp_path):
    data = make_corpus(tmp_path / "c", shards=3, per_shard=4, seed=2,
                       corrupt={"s2_00001": "image", "s2_00006": "caption"})
    tars = sorted(data.glob("*.tar"))
    raw = tars[2].read_bytes()
    tars[2].write_bytes(raw[: len(raw) // 2 + 100])  # truncated shard: keeps its first samples
    out = score("oracle", data, tmp_path / "o", show_progress=False)
    m = json.loads((out / "_manifest.json").read_text())
    by_kind = m["skipped"]["by_kind"]
    assert by_kind["not_image"] == 1 and by_kind["empty_caption"] == 1 and by_kind["corrupt_shard"] >= 1
    keys = {s["key"] for s in m["skipped"]["samples"]}
    assert {"s2_00001", "s2_00006", "000002.tar"} <= keys
    df = read_scores_df(out)
    assert "s2_00001" not in set(df["key"]) and m["samples"] == df["key"].nunique()
    from halsift.corpus.shards import ShardFormatError, iter_shard

    readable = []
    with pytest.raises(ShardFormatError, match=r"000002\.tar: truncated or corrupt tar after sample s2_\d+ "
                                               r"\(.*\); \d+ sample\(s\) lost$"):
        for smp in iter_shard(tars[2]):
            readable.append(smp.key)
    assert len(readable) < 4 and m["samples"] == 8 - 2 + len(readable)
    assert by_kind["corrupt_shard"] == 4 - len(readable)  # the samples lost, not the shards


def test_other_spec_or_inputs_in_same_folder_is_an_error(tmp_path):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=3)
    other = make_corpus(tmp_path / "d", shards=1, per_shard=3, seed=5)
    score("random:seed=0", data, tmp_path / "o", show_progress=False)
    with pytest.raises(RunMismatch, match="different detector"):
        score("random:seed=1", data, tmp_path / "o", show_progress=False)
    with pytest.raises(RunMismatch, match="different inputs"):
        score("random:seed=0", other, tmp_path / "o", show_progress=False)
    with pytest.raises(RunMismatch, match="different unit"):
        score("random:seed=0", data, tmp_path / "o", unit="caption", show_progress=False)
    args = ["score", "--detector", "random:seed=1", "--data", str(data), "--out", str(tmp_path / "o"), "--no-progress"]
    assert main(args) == 2
    assert main(["score", "--detector", "random:seed=0", "--data", str(data), "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 0  # same command again: resumes (nothing to do)
    m = json.loads((tmp_path / "o" / "_manifest.json").read_text())
    assert m["parts_resumed"] == 2 and m["sentences_scored_this_run"] == 0
    assert main(["score", "--detector", "oracle:x=1", "--data", str(data), "--out", str(tmp_path / "p")]) == 2


def test_manifest_and_caption_unit(tmp_path):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=5, seed=3)
    out = score("oracle", data, tmp_path / "o", unit="caption", show_progress=False)
    df = read_scores_df(out)
    m = json.loads((out / "_manifest.json").read_text())
    assert (df["sentence_index"] == -1).all() and len(df) == 10 == m["samples"] == m["sentences"]
    from halsift.corpus.shards import iter_samples

    for s in iter_samples(data):
        labels = [x["label"] for x in s.meta["sentences"]]
        want = 0.0 if "incorrect" in labels else 100.0 if set(labels) == {"correct"} else 50.0
        assert df.loc[df["key"] == s.key, "score"].item() == want
    tars = sorted(data.glob("*.tar"))
    assert (m["detector"], m["unit"], m["status"]) == ("oracle", "caption", "complete")
    assert m["inputs"] == {"kind": "shards", "paths": [str(t.resolve()) for t in tars]}
    assert (m["parts"], m["parts_resumed"], m["world_size"], m["ranks"]) == (2, 0, 1, [0])
    assert m["sentences_scored_this_run"] == 10 and m["parse_failures"] == 0  # the oracle parses every label
    assert m["skipped"] == {"total": 0, "by_kind": {}, "samples": [], "samples_omitted": 0}
    t = m["scoring_time_s"]  # rounded to 1 ms; the rate is rounded to 0.01 from the unrounded time
    assert 0 < t <= m["wall_time_s"] + 1e-3
    assert 10 / (t + 5e-4) - 0.01 <= m["sentences_per_s"] <= 10 / max(t - 5e-4, 1e-9) + 0.01
    share = m["time_share"]
    assert share["model"] + share["data"] == pytest.approx(100, abs=0.02) and share["decode"] >= 0  # in %


def test_score_bench_rows(tmp_path):
    bench = make_bench(tmp_path / "b", captions=7)
    df = score_bench("oracle", bench)
    rows = [json.loads(x) for x in bench.read_text().splitlines()]
    want = {r["id"]: {"correct": 100, "incorrect": 0, "unknown": 50}[r["label"]] for r in rows}
    assert len(df) == len(rows)
    assert dict(zip(df["key"], df["score"])) == want
    assert dict(zip(df["key"], df["sentence_index"])) == {r["id"]: r["position"] for r in rows}
    assert set(df.columns) >= {"key", "sentence_index", "score", "parsed", "detector"}
    clip = score_bench("clip:arch=halsift-tiny,pretrained=random", bench, tmp_path / "clip")
    assert len(clip) == len(rows)
    from PIL import Image

    from halsift.filtering.detectors.base import Item
    from halsift.filtering.detectors.spec import load_detector

    det = load_detector("clip:arch=halsift-tiny,pretrained=random")  # each row scored alone with its own image file
    for r in rows:
        with Image.open(bench.parent / r["image"]) as im:
            want = det.score_batch([Item(r["id"], r["position"], r["sentence"], [], im.convert("RGB"))])[0].score
        assert clip.loc[clip["key"] == r["id"], "score"].item() == pytest.approx(want, abs=1e-3), r["id"]


def test_ensemble_rank_norm_is_over_the_whole_run(tmp_path):
    data = make_corpus(tmp_path / "c", shards=3, per_shard=4, seed=4)
    out = score("ensemble:members=[oracle,random:seed=2],weights=[1,3],norm=rank", data, tmp_path / "e",
                batch_size=3, show_progress=False)
    o = _rows(score("oracle", data, tmp_path / "o", show_progress=False))
    r = _rows(score("random:seed=2", data, tmp_path / "r", show_progress=False))
    n = len(o)
    want = (100 * (rankdata(o["score"]) - 1) / (n - 1) + 3 * 100 * (rankdata(r["score"]) - 1) / (n - 1)) / 4
    np.testing.assert_allclose(_rows(out)["score"], want, rtol=1e-5)


def test_decode_workers_write_the_same_parts(tmp_path, capsys):
    """``--decode-workers 2``: reading, decoding and the clip scorer's preprocessing in worker processes give the
    same rows, scores and skip counts as the in-process path, part by part (a corrupt image included)."""
    import json as _json

    import pyarrow.parquet as pq

    from halsift.filtering.scoring.parts import part_stats

    data = make_corpus(tmp_path / "data", shards=4, per_shard=3, corrupt={"s0_00004": "image"})
    for out, extra in ((tmp_path / "a", []), (tmp_path / "b", ["--decode-workers", "2"])):
        assert main(["score", "--detector", "clip:arch=halsift-tiny,pretrained=random,seed=0", "--data", str(data),
                     "--out", str(out), "--no-progress", "--batch-size", "4", *extra]) == 0
    parts = sorted(p.name for p in (tmp_path / "a").glob("part-*.parquet"))
    assert parts == sorted(p.name for p in (tmp_path / "b").glob("part-*.parquet")) and len(parts) == 4
    for name in parts:
        a, b = pq.read_table(tmp_path / "a" / name), pq.read_table(tmp_path / "b" / name)
        assert a.drop(["score"]).equals(b.drop(["score"]))
        assert max(abs(x - y) for x, y in zip(a["score"].to_pylist(), b["score"].to_pylist())) < 1e-4
        sa, sb = part_stats(tmp_path / "a" / name), part_stats(tmp_path / "b" / name)
        assert (sa["samples"], sa["skipped"], sa["source_fp"]) == (sb["samples"], sb["skipped"], sb["source_fp"])
    ma = _json.loads((tmp_path / "a" / "_manifest.json").read_text())
    mb = _json.loads((tmp_path / "b" / "_manifest.json").read_text())
    assert ma["skipped"]["total"] == mb["skipped"]["total"] >= 1 and ma["sentences"] == mb["sentences"]
    assert main(["score", "--detector", "random:seed=0", "--data", str(data), "--out", str(tmp_path / "c"),
                 "--decode-workers", "-1"]) == 2


def _photo_corpus(out: Path, n: int = 12) -> Path:
    """256x192 JPEGs (smooth gradients with a little noise, like photos), two sentences each."""
    import io

    from PIL import Image

    from halsift.corpus.shards import Sample, ShardWriter

    rng = np.random.default_rng(0)
    x = np.linspace(0, 1, 256)
    with ShardWriter(out, maxcount=6) as w:
        for i in range(n):
            c = rng.uniform(0, 255, 3)
            arr = np.stack([np.add.outer(np.linspace(0, 1, 192), x) * c[k] / 2 for k in range(3)], -1)
            arr = np.clip(arr + rng.normal(0, 8, arr.shape), 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, "JPEG", quality=90)
            sents = [{"text": t, "position": j, "label": "correct", "types": [], "spans": []}
                     for j, t in enumerate([f"A gradient number {i}.", "It is mostly one colour."])]
            w.write(Sample(f"p{i:03d}", buf.getvalue(), " ".join(s["text"] for s in sents), ext="jpg",
                           meta={"captioner": "c", "source": "i2t", "sentences": sents}))
    return out


@pytest.mark.parametrize("workers", [0, 1])
def test_fast_decode_decodes_jpegs_near_the_model_input_size_with_near_equal_scores(tmp_path, workers):
    from halsift.filtering.detectors.spec import load_detector

    data = _photo_corpus(tmp_path / "c")
    full = load_detector("clip:arch=halsift-tiny,pretrained=random,seed=0")
    fast = load_detector("clip:arch=halsift-tiny,pretrained=random,seed=0,fast_decode=true")
    assert (full.decode_size, fast.decode_size) == (None, 64)  # halsift-tiny's input side
    sizes: dict[str, set] = {"full": set(), "fast": set()}
    class Spy:  # the images the preprocessing receives
        def __init__(self, inner, seen):
            self.inner, self.seen = inner, seen

        def __call__(self, images):  # shard JPEGs come as arrays: the clip scorer takes image_arrays
            self.seen.update((type(im).__name__, (im.shape[1], im.shape[0])) for im in images)
            return self.inner(images)

        def finish(self, *a, **kw):
            return self.inner.finish(*a, **kw)

        def __getattr__(self, name):  # the rest of the batcher (geometry, counts) as it is
            return getattr(self.inner, name)

    for name, det in (("full", full), ("fast", fast)):
        det.pixels = Spy(det.pixels, sizes[name])
        score(det, data, tmp_path / name, batch_size=8, device="cpu", show_progress=False, workers=workers)
    if workers == 0:  # forked workers record in their own copy of the set
        # 1/2 scale: 1/4 would cut below 64
        assert sizes == {"full": {("ndarray", (256, 192))}, "fast": {("ndarray", (128, 96))}}
    a, b = _rows(tmp_path / "full"), _rows(tmp_path / "fast")
    pd.testing.assert_frame_equal(a[["key", "sentence_index"]], b[["key", "sentence_index"]])
    assert not np.array_equal(a["score"], b["score"])  # other pixels ...
    np.testing.assert_allclose(a["score"], b["score"], atol=0.2)  # ... the same picture to the model
    # a folder scored in full is not resumed with reduced-scale decoding
    with pytest.raises(RunMismatch, match="holds scores with a different detector"):
        score("clip:arch=halsift-tiny,pretrained=random,seed=0,fast_decode=true", data, tmp_path / "full", batch_size=8,
              device="cpu", show_progress=False)


@pytest.mark.parametrize("workers", [0, 1])
def test_images_as_arrays_or_pil_images_give_the_same_scores(tmp_path, workers):
    from halsift.filtering.detectors.spec import load_detector

    data = _photo_corpus(tmp_path / "c")
    spec = "clip:arch=halsift-tiny,pretrained=random,seed=0,fast_decode=true"
    arrays, pil = load_detector(spec), load_detector(spec)
    pil.image_arrays = False  # the PIL images every other detector gets
    assert arrays.image_arrays
    for name, det in (("arrays", arrays), ("pil", pil)):
        score(det, data, tmp_path / name, batch_size=8, device="cpu", show_progress=False, workers=workers)
    pd.testing.assert_frame_equal(_rows(tmp_path / "arrays"), _rows(tmp_path / "pil"))


class Encoding(UserDict):  # a mapping type of its own, like transformers' BatchEncoding
    pass


def test_worker_tensors_travel_as_arrays_and_come_back_equal():
    import pickle

    import torch

    from halsift.filtering.scoring.workers import _Array, _pack, _unpack

    prepared = {"pixels": torch.arange(24, dtype=torch.uint8).view(2, 3, 4, 1), "rows": torch.tensor([0, 0, 1]),
                "inputs": Encoding(ids=torch.ones(2, 5, dtype=torch.int64), mask=[torch.zeros(3)]),
                "half": torch.ones(2, dtype=torch.bfloat16), "names": ("a", "b"), "n": 3}
    packed = pickle.loads(pickle.dumps(_pack(prepared)))
    assert isinstance(packed["pixels"], _Array) and isinstance(packed["inputs"]["ids"], _Array)
    assert isinstance(packed["inputs"], Encoding) and isinstance(packed["inputs"]["mask"][0], _Array)
    assert isinstance(packed["half"], torch.Tensor)  # numpy has no bfloat16: sent as a tensor
    back = _unpack(packed)
    for k in ("pixels", "rows", "half"):
        assert torch.equal(back[k], prepared[k]) and back[k].dtype == prepared[k].dtype
    assert torch.equal(back["inputs"]["ids"], prepared["inputs"]["ids"]) and isinstance(back["inputs"], Encoding)
    assert (back["names"], back["n"]) == (("a", "b"), 3)
