"""dedup's global part streams the per-shard parts: its Python-side memory does not grow with the corpus.

Synthetic descriptor parts (as `hash_parts` writes them, marked current for placeholder shards, so `run_dedup`
reuses them and runs only the global part) of 2k and 20k samples, 500 per part. Holding a per-sample Python object
(a list of keys, a dict of rows, every thumbnail joined into one bytes object) would make the 20k run's tracemalloc
peak ~10x the 2k run's; streaming part by part keeps the ratio near 1.
"""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from halsift.filtering.curation import dedup, search
from halsift.filtering.curation.descriptors import THUMB_DIM
from halsift.filtering.curation.hash_parts import SCHEMA, part_path, shard_stamp

PER_PART = 500


def _parts_folder(root, n: int, seed: int = 0):
    """``root/corpus`` (empty placeholder shards) and ``root/out/_parts`` (their current parts): random
    descriptors, plus every 100th sample a byte-identical copy (same image sha, phash and thumbnail) of the one
    before it."""
    rng = np.random.default_rng(seed)
    corpus, out = root / "corpus", root / "out"
    corpus.mkdir(parents=True)
    (out / "_parts").mkdir(parents=True)
    copies = []
    for p in range(n // PER_PART):
        shard = corpus / f"{p:06d}.tar"
        shard.write_bytes(b"")
        rows = np.arange(p * PER_PART, (p + 1) * PER_PART)
        sha = [f"{x:064x}" for x in rng.integers(0, 2**62, PER_PART)]
        phash = rng.integers(0, 256, (PER_PART, 8), dtype=np.uint8)
        thumb = rng.integers(0, 256, (PER_PART, THUMB_DIM), dtype=np.uint8)
        for i in range(1, PER_PART, 100):
            sha[i], phash[i], thumb[i] = sha[i - 1], phash[i - 1], thumb[i - 1]
            copies.append((f"k{rows[i]:07d}", f"k{rows[i - 1]:07d}"))
        table = pa.table({"key": [f"k{r:07d}" for r in rows], "image_sha": sha,
                          "caption_sha": [f"{r:064x}" for r in rows],
                          "phash": pa.array([bytes(x) for x in phash], pa.binary(8)),
                          "thumb": pa.array([bytes(x) for x in thumb], pa.binary())}, schema=SCHEMA)
        meta = {"shard": str(shard), "stamp": shard_stamp(shard), "skipped": {}}
        pq.write_table(table.replace_schema_metadata({b"halsift": json.dumps(meta).encode()}),
                       part_path(out / "_parts", shard))
    return corpus, out, copies


def _peak(root, n: int, against) -> tuple[int, dict, list]:
    corpus, out, copies = _parts_folder(root, n)
    tracemalloc.start()
    manifest = dedup.run_dedup(str(corpus), out, against=[str(against)], show_progress=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, manifest, copies


def test_global_part_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(dedup, "EVAL_BATCH", 512)  # fixed batches, smaller than the small corpus
    monkeypatch.setattr(search, "BATCH", 512)
    against = tmp_path / "eval"
    against.mkdir()
    rng = np.random.default_rng(9)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(against / f"e{i}.png")
    _peak(tmp_path / "warm", 1000, against)  # imports and library set-up are not the corpus's
    small, m_small, copies_small = _peak(tmp_path / "small", 2_000, against)
    large, m_large, copies_large = _peak(tmp_path / "large", 20_000, against)
    assert m_large["samples"] == 20_000 and m_large["shards_reused"] == 40  # only the global part ran
    for m, copies, out in ((m_small, copies_small, "small"), (m_large, copies_large, "large")):
        rows = pq.read_table(tmp_path / out / "out" / "duplicates.parquet").to_pylist()
        assert sorted((r["key"], r["matched"], r["reason"]) for r in rows) == sorted(
            (k, o, "exact") for k, o in copies)
        assert m["counts"] == {"exact": len(copies), "near": 0, "eval": 0}
    assert large < 3 * small, (small, large)
