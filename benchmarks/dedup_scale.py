"""Dedup + decontamination of N synthetic embeddings (default 1M) on this machine: time, peak memory, recall.

Embeddings are random unit vectors (dim 256, float16 as `halsift embed` stores them), generated chunk by chunk from
a seed (never all pairs, never all vectors outside faiss's index). Planted: ``dups`` near-duplicate pairs (a
corpus vector plus noise at cosine ~0.97) and ``leaks`` corpus vectors that near-duplicate one of ``evals``
evaluation vectors. Runs :func:`halsift.filtering.curation.search.cosine_pairs` (IVF clustered range search) and
:func:`~halsift.filtering.curation.search.best_matches`, the calls `halsift dedup --embeddings` makes.

    .venv/bin/python benchmarks/dedup_scale.py --n 1000000              # lists on disk, as halsift dedup runs it
    .venv/bin/python benchmarks/dedup_scale.py --n 1000000 --in-memory  # the whole index in memory

Peak RSS counts the memory-mapped lists' resident pages (file-backed: the kernel drops them under pressure); the
peak of anonymous memory (``RssAnon``, sampled every 0.2 s) is what the process cannot give back.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

CHUNK = 50_000


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make(n: int, dim: int, dups: int, leaks: int, evals: int, noise: float, seed: int):
    """A chunk factory and the planted truth: dup pairs (i, j) with i < j, and leaks {corpus row: eval row}."""
    rng = np.random.default_rng(seed)
    evals_v = _unit(rng.standard_normal((evals, dim))).astype(np.float32)
    rows = rng.choice(n, 2 * dups + leaks, replace=False)
    src, dst, lk = rows[:dups], rows[dups:2 * dups], rows[2 * dups:]
    pairs = {(int(min(a, b)), int(max(a, b))) for a, b in zip(src, dst)}
    leak_of = {int(r): int(e) for r, e in zip(lk, rng.integers(0, evals, leaks))}

    def base(lo: int, hi: int) -> np.ndarray:  # row r's own random vector, the same in every call
        return _unit(np.random.default_rng([seed, 1, lo + 1]).standard_normal((hi - lo, dim))).astype(np.float32)

    copy_of = {}
    want = {int(a): int(b) for a, b in zip(src, dst)}
    for lo in range(0, n, CHUNK):  # one pass collects the rows that are copied
        hits = [a for a in want if lo <= a < lo + CHUNK]
        if hits:
            v = base(lo, min(lo + CHUNK, n))
            copy_of.update({want[a]: v[a - lo].copy() for a in hits})  # a copy: a view would keep its chunk
    copy_of.update({r: evals_v[e] for r, e in leak_of.items()})

    def chunks():
        for lo in range(0, n, CHUNK):
            hi = min(lo + CHUNK, n)
            v = base(lo, hi)
            for r in [r for r in copy_of if lo <= r < hi]:
                g = np.random.default_rng([seed, 2, r + 1]).standard_normal(dim).astype(np.float32)
                v[r - lo] = _unit((copy_of[r] + noise * g / np.sqrt(dim))[None])[0]
            yield v.astype(np.float16).astype(np.float32)

    return chunks, evals_v, pairs, leak_of


class AnonPeak:
    """The peak of this process's anonymous resident memory (``RssAnon``, kB), sampled by a thread."""

    def __init__(self, every: float = 0.2) -> None:
        self.peak, self._done = 0, threading.Event()
        self._t = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._t.start()

    def _sample(self) -> None:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                self.peak = max(self.peak, int(line.split()[1]))

    def _run(self, every: float) -> None:
        while not self._done.wait(every):
            self._sample()

    def stop(self) -> int:
        self._done.set()
        self._t.join()
        self._sample()
        return self.peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--dups", type=int, default=5000)
    ap.add_argument("--leaks", type=int, default=1000)
    ap.add_argument("--evals", type=int, default=5000)
    ap.add_argument("--noise", type=float, default=0.25, help="planted copy = unit(v + noise * g / sqrt(dim))")
    ap.add_argument("--cosine", type=float, default=0.95)
    ap.add_argument("--nprobe", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--in-memory", action="store_true", help="hold the whole index in memory (no lists on disk)")
    a = ap.parse_args()
    from halsift.filtering.curation.search import best_matches, cosine_pairs, default_nlist

    anon = AnonPeak()
    chunks, evals_v, pairs, leak_of = make(a.n, a.dim, a.dups, a.leaks, a.evals, a.noise, a.seed)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="dedup-scale-") as spill:
        i, j, s = cosine_pairs(chunks, a.n, a.dim, a.cosine, nprobe=a.nprobe, seed=a.seed,
                               spill_dir=None if a.in_memory else Path(spill))
    t_dedup = time.time() - t0
    found = set(zip(i.tolist(), j.tolist()))
    t1 = time.time()
    rows, owner, sims = best_matches(chunks(), evals_v, np.arange(len(evals_v)), a.cosine)
    t_eval = time.time() - t1
    hit = dict(zip(rows.tolist(), owner.tolist()))
    out = {"n": a.n, "dim": a.dim, "nlist": default_nlist(a.n), "nprobe": a.nprobe, "cosine": a.cosine,
           "dedup_s": round(t_dedup, 1), "decontam_s": round(t_eval, 1),
           "lists": "in memory" if a.in_memory else "on disk",
           "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
           "peak_anon_gb": round(anon.stop() / 2**20, 2),
           "dup_recall_pct": round(100 * len(pairs & found) / len(pairs), 2),
           "extra_pairs": len(found - pairs),
           "leak_recall_pct": round(100 * sum(hit.get(r) == e for r, e in leak_of.items()) / len(leak_of), 2),
           "clean_flagged": len(set(hit) - set(leak_of))}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
