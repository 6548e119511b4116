"""Out-of-core selection (DuckDB): the same kept set as the in-memory select_keys, ties and all."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from halsift.corpus.scores import write_part_atomic
from halsift.filtering.selection.select import SelectError, select_keys
from halsift.filtering.selection.out_of_core import kept_for_part, supported, top_keys


def _scores(folder, parts=5, captions=40, decimals=0, seed=0, caption_level=False):
    """Score parts with coarse scores (many ties at any cut-off)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for p in range(parts):
        keys, idx = [], []
        for c in range(captions):
            n = 1 if caption_level else int(rng.integers(1, 4))
            keys += [f"k{p:02d}_{c:03d}"] * n
            idx += [-1] if caption_level else list(range(n))
        score = np.round(rng.uniform(0, 100, len(keys)), decimals).astype(np.float32)
        write_part_atomic(pa.table({"key": keys, "sentence_index": pa.array(idx, pa.int32()), "score": score,
                                    "parsed": [True] * len(keys), "detector": ["d"] * len(keys)}),
                          folder / f"part-{p:06d}.parquet")
    return folder


def _same(a: pa.Table, b: pa.Table) -> None:
    assert a["key"].to_pylist() == b["key"].to_pylist()
    assert a["sentence_index"].to_pylist() == b["sentence_index"].to_pylist()
    np.testing.assert_array_equal(pc.cast(a["score"], pa.float64()).to_numpy(),
                                  pc.cast(b["score"], pa.float64()).to_numpy())


@pytest.mark.parametrize("how", [dict(keep=0.2), dict(keep=0.5, seed=3), dict(top_k=37), dict(threshold=61.0),
                                 dict(keep=1.0), dict(top_k=0), dict(keep=0.3, unit="caption", agg="min"),
                                 dict(keep=0.3, unit="caption", agg="prune")])
def test_same_kept_set_as_in_memory(tmp_path, how):
    scores = _scores(tmp_path / "s", decimals=-1)  # scores 0, 10, ..., 100: big ties at every cut
    kept, info = select_keys(scores, **how)
    got = top_keys(scores, tmp_path / "o", threads=1, **how)
    assert got == info
    _same(pq.read_table(tmp_path / "o" / "kept.parquet"), kept)
    by_part = pa.concat_tables([kept_for_part(tmp_path / "o", f"part-{p:06d}.parquet") for p in range(5)])
    assert sorted(zip(by_part["key"].to_pylist(), by_part["sentence_index"].to_pylist())) == \
        list(zip(kept["key"].to_pylist(), kept["sentence_index"].to_pylist()))
    assert not (tmp_path / "o" / ".select-work").exists()


def test_caption_level_scores(tmp_path):
    scores = _scores(tmp_path / "s", caption_level=True, decimals=1, seed=4)
    kept, info = select_keys(scores, keep=0.25, unit="caption")
    assert top_keys(scores, tmp_path / "o", keep=0.25, unit="caption", threads=1) == info
    _same(pq.read_table(tmp_path / "o" / "kept.parquet"), kept)
    with pytest.raises(SelectError, match="scores are caption-level"):
        top_keys(scores, tmp_path / "p", keep=0.25)


def test_unsupported_cases_name_why():
    assert supported("sentence", "min") is None
    assert "per_captioner" in supported("sentence", "min", per_captioner=True)
    assert "agg=mean" in supported("caption", "mean")
