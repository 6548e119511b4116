"""The embedding store's layout: what `halsift embed` writes is what dedup and the CLIP detectors read back."""

import json

import numpy as np
import pytest

from halsift.corpus import embedding_store as es


def _store(tmp_path, dim=4, complete=True):
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(3, dim)).astype(np.float32)
    t = es.embedding_table(["a", "a", "b"], [es.IMAGE, 0, es.IMAGE], vecs)
    es.write_embedding_part(t, tmp_path / "part-000.parquet", {"source": "s0"})
    (tmp_path / es.MANIFEST).write_text(json.dumps({"format": es.FORMAT, "model": "clip:x", "dim": dim,
                                                    "complete": complete}))
    return vecs


def test_round_trip_normalised_float16_by_kind(tmp_path):
    vecs = _store(tmp_path)
    img = es.read_embeddings(tmp_path)
    assert list(img.keys) == ["a", "b"] and img.vectors.dtype == np.float16 and img.dim == 4
    want = vecs[[0, 2]] / np.linalg.norm(vecs[[0, 2]], axis=1, keepdims=True)
    np.testing.assert_allclose(img.vectors.astype(np.float32), want, atol=1e-3)
    txt = es.read_embeddings(tmp_path, kind=0)
    assert list(txt.keys) == ["a"] and list(txt.sentence_index) == [0]
    assert es.part_meta(tmp_path / "part-000.parquet") == {"source": "s0"}


def test_incomplete_missing_and_foreign_folders_are_named(tmp_path):
    _store(tmp_path, complete=False)
    with pytest.raises(es.EmbeddingStoreError, match="not complete"):
        es.read_embeddings(tmp_path)
    assert len(es.read_embeddings(tmp_path, require_complete=False)) == 2
    with pytest.raises(es.EmbeddingStoreError, match="_manifest.json is missing"):
        es.read_embeddings(tmp_path / "..")
    (tmp_path / es.MANIFEST).write_text(json.dumps({"format": "other", "model": "m", "dim": 4}))
    with pytest.raises(es.EmbeddingStoreError, match="format is 'other'"):
        es.read_manifest(tmp_path)


def test_dimension_mismatch_is_refused(tmp_path):
    _store(tmp_path)
    (tmp_path / es.MANIFEST).write_text(json.dumps({"format": es.FORMAT, "model": "m", "dim": 8, "complete": True}))
    with pytest.raises(es.EmbeddingStoreError, match=r"expected fixed_size_list<float16>\[8\]"):
        es.read_embeddings(tmp_path)
    (tmp_path / es.MANIFEST).write_text(json.dumps({"format": es.FORMAT, "model": "m", "dim": 4, "complete": True}))
    with pytest.raises(es.EmbeddingStoreError, match="holds 4-dimensional vectors, expected 512"):
        es.check_dim(es.read_embeddings(tmp_path), 512, "EMB")
