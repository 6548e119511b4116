"""dedup's global part streams the per-shard parts: its Python-side memory does not grow with the corpus.

Synthetic descriptor parts (``benchmarks/dedup_parts.py``: as ``hash_parts`` writes them, marked current for
placeholder shards, so ``run_dedup`` reuses them and runs only the global part) of 2k and 20k samples, 500 per part.
Holding a per-sample Python object (a list of keys, a dict of rows, every thumbnail joined into one bytes object)
made the 20k run's tracemalloc peak 8x the 2k run's; streaming part by part keeps the ratio near 1.
"""

from __future__ import annotations

import importlib.util
import sys
import tracemalloc
from pathlib import Path

import pyarrow.parquet as pq

from halsift.filtering.curation import dedup, search

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    name = "halsift_bench_dedup_parts"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "dedup_parts.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _run(root: Path, n: int) -> tuple[int, dict, dict, dict]:
    """tracemalloc peak of ``run_dedup`` on ``n`` samples' parts, its manifest, its rows and the planted copies."""
    b = _bench()
    corpus, out, planted = b.write_parts(root, n, per_part=500)
    against = b.write_against(root)
    tracemalloc.start()
    manifest = dedup.run_dedup(str(corpus), out, against=[str(against)], show_progress=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rows = {r["key"]: (r["matched"], r["reason"]) for r in pq.read_table(out / "duplicates.parquet").to_pylist()}
    return peak, manifest, rows, planted


def test_global_part_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(dedup, "EVAL_BATCH", 512)  # fixed batches, smaller than the small corpus
    monkeypatch.setattr(search, "BATCH", 512)
    _run(tmp_path / "warm", 1000)  # imports and library set-up are not the corpus's
    small, m_small, rows_small, planted_small = _run(tmp_path / "small", 2_000)
    large, m_large, rows_large, planted_large = _run(tmp_path / "large", 20_000)
    assert m_large["samples"] == 20_000 and m_large["shards_reused"] == 40  # only the global part ran
    for rows, planted in ((rows_small, planted_small), (rows_large, planted_large)):
        assert rows == planted and {r for _, r in planted.values()} == {"exact", "near"}
    assert large < 3 * small, (small, large)
