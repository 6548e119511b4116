"""``halsift embed`` and CLIP-family detectors reading its vectors: embed once, then every CLIP-family detector
scores from the store (image encodes counted: one per image, all in the embed pass), with scores equal to encoding
on the fly up to the float16 rounding of the stored vectors; resumable per part, split by the score engines; a
store of another model or width is refused in one line (exit 2)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import open_clip
import pyarrow.parquet as pq
import pytest
from filtering_data import make_corpus

from halsift.corpus.embedding_store import CAPTION, IMAGE, read_embeddings, read_manifest
from halsift.corpus.errors import InputError
from halsift.corpus.scores import read_scores_df
from halsift.filtering.detectors.embeddings_spec import with_embeddings
from halsift.filtering.detectors.spec_error import SpecError
from halsift.filtering.scoring.embed import EmbedJob
from halsift.execution.engines import EngineError, run_job
from halsift.launch.cli import main

TINY = "clip:arch=halsift-tiny,pretrained=random,seed=0"
# |cos(a16, b16) - cos(a, b)| for unit vectors whose entries are rounded to float16 (unit roundoff u = 2^-11):
# sum |a_i b_i| (2u + u^2) <= 2u + u^2 by Cauchy-Schwarz; the linear map multiplies by 50.
FP16_BOUND = 50 * (2 * 2.0 ** -11 + 2.0 ** -22)


@pytest.fixture
def corpus(tmp_path):
    return make_corpus(tmp_path / "c", shards=3, per_shard=3, seed=1, corrupt={"s1_00004": "image"})


@pytest.fixture
def image_encodes(monkeypatch):
    """Images passed through any open_clip CLIP model's encode_image in this process."""
    seen = {"images": 0}
    real = open_clip.model.CLIP.encode_image

    def counted(self, image, *a, **kw):
        seen["images"] += int(image.shape[0])
        return real(self, image, *a, **kw)

    monkeypatch.setattr(open_clip.model.CLIP, "encode_image", counted)
    return seen


def _scores(folder):
    return read_scores_df(folder).sort_values(["key", "sentence_index"]).reset_index(drop=True)


def _score(spec, data, out, *extra):
    assert main(["score", "--detector", spec, "--data", str(data), "--out", str(out), "--no-progress",
                 "--batch-size", "5", *extra]) == 0


def test_embed_writes_image_caption_and_sentence_vectors_per_shard(corpus, tmp_path):
    m = run_job(EmbedJob(TINY, corpus, tmp_path / "emb", batch_size=5, show_progress=False)).stats
    assert m["complete"] and m["parts"] == 3 and m["samples"] == 8 and m["skipped"]["total"] == 1
    assert m["model"] == "clip:arch=halsift-tiny,fast_decode=false,pretrained=random,seed=0" and m["dim"] == 32
    assert read_manifest(tmp_path / "emb")["format"] == "halsift-embeddings/1"
    every = read_embeddings(tmp_path / "emb", kind=None)
    keys = set(every.keys)
    assert len(keys) == 8 and "s1_00004" not in keys  # the corrupt sample is skipped, as score skips it
    for k in keys:  # one image vector, one caption vector, sentences 0..n-1
        idx = sorted(every.sentence_index[every.keys == k].tolist())
        assert idx[:2] == [CAPTION, IMAGE] and idx[2:] == list(range(len(idx) - 2))
    assert m["images"] == 8 and m["texts"] == len(every) - 8
    norms = np.linalg.norm(every.vectors.astype(np.float32), axis=1)
    assert every.vectors.dtype == np.float16 and np.abs(norms - 1).max() < 2e-3


@pytest.mark.parametrize("unit", ["sentence", "caption"])
def test_scores_from_embeddings_equal_encoding_on_the_fly(corpus, tmp_path, unit):
    run_job(EmbedJob(TINY, corpus, tmp_path / "emb", batch_size=5, show_progress=False))
    _score(TINY, corpus, tmp_path / "fly", "--unit", unit)
    _score(TINY, corpus, tmp_path / "stored", "--unit", unit, "--embeddings", str(tmp_path / "emb"))
    fly, stored = _scores(tmp_path / "fly"), _scores(tmp_path / "stored")
    assert fly[["key", "sentence_index"]].equals(stored[["key", "sentence_index"]]) and len(fly) >= 8
    assert np.abs(fly["score"] - stored["score"]).max() <= FP16_BOUND
    # exactly the stored vectors' cosine, mapped: nothing else differs
    emb = read_embeddings(tmp_path / "emb", kind=None)
    vec = {(k, int(i)): v.astype(np.float32) for k, i, v in zip(emb.keys, emb.sentence_index, emb.vectors)}
    want = [50 * (float(vec[(k, IMAGE)] @ vec[(k, CAPTION if i == -1 else i)]) + 1)
            for k, i in zip(stored["key"], stored["sentence_index"])]
    np.testing.assert_allclose(stored["score"], want, atol=1e-5)
    manifest = json.loads((tmp_path / "stored" / "_manifest.json").read_text())
    assert f"embeddings={tmp_path / 'emb'}" in manifest["detector"]


def test_embed_once_then_two_clip_detectors_encode_each_image_once(corpus, tmp_path, image_encodes):
    run_job(EmbedJob(TINY, corpus, tmp_path / "emb", batch_size=5, show_progress=False))
    assert image_encodes["images"] == 8  # one per valid image, in the embed pass
    _score(TINY, corpus, tmp_path / "linear", "--embeddings", str(tmp_path / "emb"))
    _score(TINY + ",map=sigmoid", corpus, tmp_path / "sigmoid", "--embeddings", str(tmp_path / "emb"))
    assert image_encodes["images"] == 8  # neither detector encoded an image
    _score(TINY, corpus, tmp_path / "fly")
    assert image_encodes["images"] == 16  # the control: scoring on the fly encodes each image again


def test_embed_resumes_per_part_and_tasks_write_the_same_parts(corpus, tmp_path):
    job = EmbedJob(TINY, corpus, tmp_path / "emb", batch_size=5, show_progress=False)
    run_job(job)
    first = {p.name: pq.read_table(p) for p in (tmp_path / "emb").glob("part-*.parquet")}
    (tmp_path / "emb" / "part-000001.parquet").unlink()
    m = run_job(job).stats
    assert (m["parts_resumed"], m["parts_embedded_this_run"], m["complete"]) == (2, 1, True)
    for name, t in first.items():
        assert pq.read_table(tmp_path / "emb" / name).equals(t)
    runs = [run_job(dataclasses.replace(job, out=tmp_path / "tasks", num_tasks=2, task_index=i)) for i in (0, 1)]
    assert [r.engine for r in runs] == ["tasks", "tasks"] and runs[-1].complete
    for name, t in first.items():
        assert pq.read_table(tmp_path / "tasks" / name).equals(t)
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # embed on Ray itself: tests/filtering/test_ray_engine.py
        with pytest.raises(InputError, match="--engine ray: Ray is not installed"):
            run_job(job, engine="ray")
    with pytest.raises(EngineError, match="--address/--workers: only with --engine ray"):
        run_job(dataclasses.replace(job, workers=2))


def test_bad_embeddings_are_one_line_exit_2(corpus, tmp_path, capsys):
    assert main(["embed", "--model", TINY, "--data", str(corpus), "--out", str(tmp_path / "emb"),
                 "--no-progress"]) == 0
    capsys.readouterr()
    other = TINY.replace("seed=0", "seed=1")
    base = ["score", "--data", str(corpus), "--no-progress", "--embeddings", str(tmp_path / "emb")]
    assert main([*base, "--detector", other, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "embedded by 'clip:arch=halsift-tiny,fast_decode=false,pretrained=random,seed=0'" in err
    assert len(err.strip().splitlines()) == 1
    manifest = tmp_path / "emb" / "_manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "dim": 64}))
    assert main([*base, "--detector", TINY, "--out", str(tmp_path / "b")]) == 2
    assert "64-dimensional vectors, the model's are 32-dimensional" in capsys.readouterr().err
    assert main([*base, "--detector", "random:seed=0", "--out", str(tmp_path / "c")]) == 2
    assert "has no CLIP-family detector (clip) to read them" in capsys.readouterr().err
    assert main(["embed", "--model", other, "--data", str(corpus), "--out", str(tmp_path / "emb"),
                 "--no-progress"]) == 2  # another model into the same folder
    assert "holds embeddings with a different" in capsys.readouterr().err
    assert main(["embed", "--model", "random:seed=0", "--data", str(corpus), "--out", str(tmp_path / "d")]) == 2
    assert "do not expose image and text embeddings" in capsys.readouterr().err


def test_with_embeddings_reaches_every_clip_member():
    spec = "ensemble:members=[clip:arch=halsift-tiny,pretrained=random;random:seed=0],weights=[1,1]"
    assert with_embeddings(spec, "/e") == ("ensemble:members=[clip:arch=halsift-tiny,embeddings=/e,"
                                           "pretrained=random;random:seed=0],weights=[1,1]")
    assert with_embeddings("clip:arch=ViT-B-32,pretrained=openai", "/e") == \
        "clip:arch=ViT-B-32,embeddings=/e,pretrained=openai"
    with pytest.raises(SpecError, match="has no CLIP-family detector"):
        with_embeddings("random:seed=0", "/e")
    # a recipe's score.embeddings goes to the specs with_embeddings takes, and leaves the others (a judge) alone
    from halsift.filtering.detectors.embeddings_spec import reads_embeddings

    assert reads_embeddings(spec) and reads_embeddings("clip:arch=ViT-B-32,pretrained=openai")
    assert not reads_embeddings("random:seed=0") and not reads_embeddings("vlm:model=/m,mode=pmi")
    assert not reads_embeddings(object()) and not reads_embeddings("clip:arch=[unclosed")
