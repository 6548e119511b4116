"""Pair search that never holds all pairs: only pairs above a threshold are returned, in batches.

- Perceptual hashes: multi-index hashing as DuckDB equi-joins (out of core under DuckDB's memory limit): the 64
  bits are cut into ``m`` chunks; two hashes within Hamming distance ``t`` agree up to ``t // m`` bits on some
  chunk (pigeonhole), so joining each chunk value with ``nflip = t // m`` flipped bits finds every pair exactly,
  touching only near buckets; ``m`` is chosen for the corpus size (:func:`hash_chunks`) so that buckets stay small
  (the work stays linear). faiss's ``IndexBinaryMultiHash`` does the same in memory (~220 MB per million hashes
  at 3 chunks); written as SQL here so that it spills instead.
- Vectors (embeddings, thumbnails): SemDeDup-style clustered search with faiss ``IndexIVFFlat`` on inner product of
  L2-normalised vectors (= cosine): spherical k-means cells, each vector searched in its ``nprobe`` nearest cells
  by ``range_search`` (only pairs above the threshold come back). faiss: the reference library for this, with
  exact flat search for small sets and the same code path on GPUs. From :data:`ON_DISK_ROWS` vectors on, given a
  ``spill_dir``, the index's inverted lists live in a memory-mapped file (faiss's ``OnDiskInvertedLists``, built by
  ``faiss.contrib.ondisk.merge_ondisk`` from blocks of :data:`BLOCK_BYTES`): the process holds the centroids and one
  block, and the vectors' pages are file-backed (the kernel drops them under memory pressure), so the search runs
  on more vectors than memory holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

BATCH = 16384
ON_DISK_ROWS = 250_000  # from this many vectors on (given a spill_dir) the inverted lists are on disk
BLOCK_BYTES = 64 << 20  # vectors added to an in-memory block index before it is written out
EXACT_REFS = 50_000  # evaluation vectors searched exactly (e.g. 1.4k images x 36 crop variants)


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)


def _concat(parts: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not parts:
        return _empty()
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]


def _lims_pairs(lims: np.ndarray, ids: np.ndarray, offset: int) -> np.ndarray:
    return np.repeat(np.arange(len(lims) - 1, dtype=np.int64) + offset, np.diff(lims.astype(np.int64)))


def hamming_pairs(hashes: np.ndarray, t: int, bar=None,
                  chunks: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``i < j`` of 64-bit hashes (uint8 ``[N, 8]``) within Hamming distance ``t``: ``(i, j, distance)``
    (:func:`hamming_pairs_sql` on an in-memory table)."""
    import duckdb
    import pyarrow as pa

    h = np.ascontiguousarray(hashes, dtype=np.uint8)
    con = duckdb.connect()
    con.register("_hashes", pa.table({"i": pa.array(np.arange(len(h), dtype=np.int64)), "phash": pa.FixedSizeBinaryArray
                                      .from_buffers(pa.binary(8), len(h), [None, pa.py_buffer(h.tobytes())])}))
    try:
        return hamming_pairs_sql(con, "SELECT i, phash FROM _hashes", len(h), t, bar, chunks)
    finally:
        con.close()


def hamming_pairs_sql(con, source: str, n: int, t: int, bar=None,
                      chunks: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``i < j`` within Hamming distance ``t`` of the ``n`` rows of SQL relation ``source`` (columns ``i``,
    the row, and ``phash``, 8 bytes) on DuckDB connection ``con``: multi-index hashing as equi-joins, so DuckDB runs
    it out of core under its memory limit. The 64 bits are cut into ``m`` chunks (:func:`hash_chunks`, or
    ``chunks``) of ``b = 64 // m`` bits; a pair within ``t`` bits differs by at most ``t // m`` bits on some chunk
    (pigeonhole), so each row's chunk value with every pattern of up to ``t // m`` flipped bits is joined with the
    others' chunk values; a pair is kept on the first chunk that finds it, when its full distance is within ``t``."""
    from itertools import combinations

    import pyarrow as pa

    if n < 2:
        if bar is not None:
            bar.update(n)
        return _empty()
    m = chunks or hash_chunks(n, t)
    b, nflip = 64 // m, t // m
    flips = [sum(1 << x for x in c) for r in range(nflip + 1) for c in combinations(range(b), r)]
    con.register("_flips", pa.table({"f": pa.array(flips, pa.uint64())}))
    con.execute(f"CREATE OR REPLACE TEMP TABLE _h AS SELECT i, ('0x' || hex(phash))::UBIGINT AS v FROM ({source})")

    def chunk(x: str, k: int) -> str:
        return f"(({x} >> {64 - b * (k + 1)}) & {(1 << b) - 1}::UBIGINT)"

    out = []
    for k in range(m):
        first = "".join(f" AND bit_count({chunk('xor(a.v, b.v)', j)}) > {nflip}" for j in range(k))
        res = con.execute(
            f"SELECT a.i AS i, b.i AS j, bit_count(xor(a.v, b.v)) AS d "
            f"FROM (SELECT i, v, xor({chunk('v', k)}, f) AS q FROM _h, _flips) a "
            f"JOIN (SELECT i, v, {chunk('v', k)} AS c FROM _h) b ON a.q = b.c "
            f"WHERE a.i < b.i AND bit_count(xor(a.v, b.v)) <= {t}{first}").fetchnumpy()
        out.append((np.asarray(res["i"], np.int64), np.asarray(res["j"], np.int64),
                    np.asarray(res["d"], np.float32)))
    con.execute("DROP TABLE _h")
    con.unregister("_flips")
    if bar is not None:
        bar.update(n)
    return _concat(out)


def hash_chunks(n: int, t: int) -> int:
    """Chunks ``m`` (of ``64 // m`` bits, ``t // m`` flipped bits probed) with the least expected work for ``n``
    uniform hashes: ``m`` x probed buckets x (1 + bucket size). Any ``m`` finds exactly the same pairs; 5 chunks
    of 12 bits (the old fixed choice at t=4) compare every hash with n/4096 others, quadratic in n, while 3 chunks
    of 21 bits probe 22 buckets each of ~n/2M hashes."""
    from math import comb

    def cost(m: int) -> float:
        b = 64 // m
        return m * sum(comb(b, k) for k in range(t // m + 1)) * (1 + n / 2.0 ** b)

    return min(range(1, 9), key=cost)


def default_nlist(n: int) -> int:
    """Cells for ``n`` vectors: ~4 sqrt(n) (faiss's guideline), at most n / 39 so k-means has data per cell."""
    return int(max(1, min(4 * np.sqrt(n), n // 39)))


def cosine_pairs(chunks: Callable[[], Iterable[np.ndarray]], n: int, dim: int, threshold: float,
                 nlist: int | None = None, nprobe: int = 8, seed: int = 0, bar=None,
                 spill_dir: Path | None = None, on_disk_rows: int = ON_DISK_ROWS
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``i < j`` (global row numbers in ``chunks()`` order) with cosine >= ``threshold``: ``(i, j, cos)``.

    ``chunks`` is called twice (add, then query) and yields float unit vectors ``[b, dim]``: the index (n x dim
    float32; on disk under ``spill_dir`` from ``on_disk_rows`` vectors on, module docstring) and one chunk are in
    memory. Small sets (nlist 1) are searched exactly. The same pairs in memory and on disk."""
    import faiss

    if n < 2:
        return _empty()
    nlist = nlist or default_nlist(n)
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.cp.spherical = True
    index.cp.niter = 10  # cells only route the search (nprobe covers boundaries): a rough k-means is enough
    index.cp.max_points_per_centroid = 40
    index.train(_training_sample(chunks, n, dim, max(nlist * 40, 10000), seed))
    if spill_dir is not None and n >= on_disk_rows:
        _add_on_disk(index, chunks, dim, Path(spill_dir))
    else:
        for c in chunks():
            index.add(np.ascontiguousarray(c, dtype=np.float32))
    index.nprobe = min(nprobe, nlist)
    out, s = [], 0
    for c in chunks():
        c = np.ascontiguousarray(c, dtype=np.float32)
        for b in range(0, len(c), BATCH):
            lims, sims, ids = index.range_search(c[b:b + BATCH], float(threshold) - 1e-6)
            q = _lims_pairs(lims, ids, s + b)
            keep = ids > q
            out.append((q[keep], ids[keep].astype(np.int64), sims[keep].astype(np.float32)))
        s += len(c)
        if bar is not None:
            bar.update(len(c))
    return _concat(out)


def _add_on_disk(index, chunks: Callable[[], Iterable[np.ndarray]], dim: int, spill_dir: Path) -> None:
    """Add every vector to the trained, empty ``index`` with its inverted lists in ``spill_dir/lists.ivfdata``
    (memory-mapped): blocks of :data:`BLOCK_BYTES` are built in memory one at a time and written out, then merged
    into the file (the block files are removed)."""
    import faiss
    from faiss.contrib.ondisk import merge_ondisk

    spill_dir.mkdir(parents=True, exist_ok=True)
    rows = max(1, BLOCK_BYTES // (4 * dim))
    blocks, start = [], 0

    def flush(vectors: list[np.ndarray]) -> None:
        nonlocal start
        v = np.ascontiguousarray(np.concatenate(vectors), dtype=np.float32)
        block = faiss.clone_index(index)
        block.add_with_ids(v, np.arange(start, start + len(v), dtype=np.int64))
        path = spill_dir / f"block{len(blocks):05d}.index"
        faiss.write_index(block, str(path))
        blocks.append(str(path))
        start += len(v)

    pending, held = [], 0
    for c in chunks():
        pending.append(np.asarray(c, dtype=np.float32))
        held += len(c)
        if held >= rows:
            flush(pending)
            pending, held = [], 0
    if pending:
        flush(pending)
    merge_ondisk(index, blocks, str(spill_dir / "lists.ivfdata"))
    for b in blocks:
        Path(b).unlink()


def _training_sample(chunks: Callable[[], Iterable[np.ndarray]], n: int, dim: int, size: int,
                     seed: int) -> np.ndarray:
    """A seeded random sample of ``size`` rows (all when fewer) for k-means, in one streaming pass."""
    rng = np.random.default_rng(seed)
    p = min(1.0, size / n)
    picked = []
    for c in chunks():
        c = np.asarray(c, dtype=np.float32)
        picked.append(c if p >= 1 else c[rng.random(len(c)) < p])
    return np.ascontiguousarray(np.concatenate(picked) if picked else np.empty((0, dim), np.float32))


def best_matches(chunks: Iterable[np.ndarray], refs: np.ndarray, owner: np.ndarray, threshold: float,
                 bar=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each query row (global order of ``chunks``) whose best cosine to a reference vector reaches
    ``threshold``: ``(row, owner[best ref], cos)``. ``refs`` (the evaluation side) is searched exactly up to
    :data:`EXACT_REFS` vectors, above in an IVF index probing 16 cells."""
    import faiss

    refs = np.ascontiguousarray(refs, dtype=np.float32)
    if len(refs) == 0:
        for c in chunks:
            if bar is not None:
                bar.update(len(c))
        return _empty()
    dim = refs.shape[1]
    if len(refs) > EXACT_REFS:
        nlist = default_nlist(len(refs))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(refs)
        index.nprobe = 16
    else:
        index = faiss.IndexFlatIP(dim)
    index.add(refs)
    out, s = [], 0
    for c in chunks:
        c = np.ascontiguousarray(c, dtype=np.float32)
        for b in range(0, len(c), BATCH):
            sims, ids = index.search(c[b:b + BATCH], 1)
            hit = (ids[:, 0] >= 0) & (sims[:, 0] >= threshold - 1e-6)
            rows = np.nonzero(hit)[0].astype(np.int64) + s + b
            out.append((rows, owner[ids[hit, 0]].astype(np.int64), sims[hit, 0].astype(np.float32)))
        s += len(c)
        if bar is not None:
            bar.update(len(c))
    return _concat(out)
