"""Pair search that never holds all pairs: only pairs above a threshold are returned, in batches.

- Perceptual hashes: faiss ``IndexBinaryMultiHash`` (multi-index hashing): the 64 bits are cut into ``m`` chunks;
  two hashes within Hamming distance ``t`` agree up to ``t // m`` bits on some chunk (pigeonhole), so probing each
  chunk's bucket with ``nflip = t // m`` flipped bits finds every pair exactly, touching only near buckets.
- Vectors (embeddings, thumbnails): SemDeDup-style clustered search with faiss ``IndexIVFFlat`` on inner product of
  L2-normalised vectors (= cosine): spherical k-means cells, each vector searched in its ``nprobe`` nearest cells
  by ``range_search`` (only pairs above the threshold come back). faiss: the reference library for this, with
  exact flat search for small sets and the same code path on GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

BATCH = 16384
EXACT_REFS = 50_000  # evaluation vectors searched exactly (e.g. 1.4k images x 36 crop variants)


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)


def _concat(parts: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not parts:
        return _empty()
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]


def _lims_pairs(lims: np.ndarray, ids: np.ndarray, offset: int) -> np.ndarray:
    return np.repeat(np.arange(len(lims) - 1, dtype=np.int64) + offset, np.diff(lims.astype(np.int64)))


def hamming_pairs(hashes: np.ndarray, t: int, bar=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``i < j`` of 64-bit hashes (uint8 ``[N, 8]``) within Hamming distance ``t``: ``(i, j, distance)``."""
    import faiss

    n = len(hashes)
    if n < 2:
        return _empty()
    m = min(t + 1, 8)  # chunks of >= 8 bits
    index = faiss.IndexBinaryMultiHash(64, m, 64 // m)
    index.nflip = t // m
    index.add(np.ascontiguousarray(hashes, dtype=np.uint8))
    out = []
    for s in range(0, n, BATCH):
        lims, dist, ids = index.range_search(np.ascontiguousarray(hashes[s:s + BATCH]), t + 1)  # distance < t+1
        q = _lims_pairs(lims, ids, s)
        keep = ids > q
        out.append((q[keep], ids[keep].astype(np.int64), dist[keep].astype(np.float32)))
        if bar is not None:
            bar.update(min(BATCH, n - s))
    return _concat(out)


def default_nlist(n: int) -> int:
    """Cells for ``n`` vectors: ~4 sqrt(n) (faiss's guideline), at most n / 39 so k-means has data per cell."""
    return int(max(1, min(4 * np.sqrt(n), n // 39)))


def cosine_pairs(chunks: Callable[[], Iterable[np.ndarray]], n: int, dim: int, threshold: float,
                 nlist: int | None = None, nprobe: int = 8, seed: int = 0,
                 bar=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``i < j`` (global row numbers in ``chunks()`` order) with cosine >= ``threshold``: ``(i, j, cos)``.

    ``chunks`` is called twice (add, then query) and yields float unit vectors ``[b, dim]``: only the index (n x
    dim float32) and one chunk are in memory. Small sets (nlist 1) are searched exactly."""
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
