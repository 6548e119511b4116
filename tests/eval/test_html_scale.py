"""The report's sample browser reads only the rows of the samples it shows (a score folder may hold millions)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq


def _part(path, keys, scores):
    n = len(keys)
    pq.write_table(pa.table({"key": keys, "sentence_index": pa.array([0] * n, pa.int32()),
                             "score": pa.array(scores, pa.float32()), "parsed": [True] * n,
                             "detector": ["d"] * n}), path)


def test_score_map_of_some_keys_reads_their_rows_from_every_part(tmp_path):
    from halsift.eval.report.html import _detectors, _score_map

    _part(tmp_path / "part-0-a.parquet", ["a", "b", "c"], [10.0, 20.0, 30.0])
    _part(tmp_path / "part-0-b.parquet", ["d", "e"], [40.0, 50.0])
    full = _score_map(tmp_path)
    assert full == {("a", 0): 10.0, ("b", 0): 20.0, ("c", 0): 30.0, ("d", 0): 40.0, ("e", 0): 50.0}
    assert _score_map(tmp_path, {"b", "e", "zz"}) == {("b", 0): 20.0, ("e", 0): 50.0}
    assert _score_map(tmp_path, set()) == {}
    assert _score_map(tmp_path / "part-0-b.parquet", {"d"}) == {("d", 0): 40.0}
    assert _detectors(tmp_path) == ["d"]


def test_shards_past_the_page_are_counted_from_their_records_not_read(tmp_path):
    """img2dataset output has no sizes.json: the shards after the shown samples are counted from their
    ``_stats.json`` (``successes``), as a million-sample corpus must be, not read through."""
    import json

    from img2dataset_data import make_img2dataset

    from halsift.eval.report.html import collect_samples

    corpus = make_img2dataset(tmp_path / "i2d", shards=3, per_shard=4)
    stats = corpus / "00002_stats.json"
    stats.write_text(json.dumps({**json.loads(stats.read_text()), "successes": 9}))  # not what its tar holds
    s = collect_samples(["d"], corpus=corpus, max_samples=2)
    assert len(s.samples) == 2
    assert s.totals["corpus"] == 4 + 4 + 9  # shard 0 read to its end; shards 1 and 2 from their records
