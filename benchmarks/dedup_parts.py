"""dedup's global part on N synthetic samples' descriptor parts: peak RSS and time per size (issue 42).

Writes descriptor parts as ``hash_parts`` does (random sha256s, phashes and thumbnails; every 1000th sample a
byte-identical copy of the one before it, every 1000th + 500 a near copy: phash one bit off, same thumbnail) for
placeholder shards, marked current, so ``run_dedup`` reuses them and runs only its global part (exact groups, phash
search, thumbnail confirmation, leak search against a few images, the output). That part runs in a child process,
whose peak RSS is reported, so the corpus writing does not count. Building the corpus images and hashing them
(the per-shard part) is what ``benchmarks/million.py`` measures.

    .venv/bin/python benchmarks/dedup_parts.py --sizes 100000 1000000
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PER_PART = 10_000
EVERY = 1000


def write_parts(root: Path, n: int, per_part: int = PER_PART, seed: int = 0) -> tuple[Path, Path, dict]:
    """``root/corpus`` (empty placeholder shards) and ``root/out/_parts`` (their current parts); returns them and
    the planted copies ``{copy key: (original key, reason)}``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from halsift.filtering.curation.descriptors import THUMB_DIM
    from halsift.execution.run_folder import part_done
    from halsift.filtering.curation.hash_parts import SCHEMA, made_from, part_path

    rng = np.random.default_rng(seed)
    corpus, out = root / "corpus", root / "out"
    corpus.mkdir(parents=True)
    (out / "_parts").mkdir(parents=True)
    planted = {}
    for p, lo in enumerate(range(0, n, per_part)):
        shard = corpus / f"{p:06d}.tar"
        shard.write_bytes(b"")
        rows = np.arange(lo, min(lo + per_part, n))
        m = len(rows)
        sha = [f"{x:016x}" * 4 for x in rng.integers(0, 2**63, m)]
        phash = rng.integers(0, 256, (m, 8), dtype=np.uint8)
        thumb = rng.integers(0, 256, (m, THUMB_DIM), dtype=np.uint8)
        for i in np.nonzero((rows % EVERY == 1) | (rows % EVERY == EVERY // 2 + 1))[0]:
            if i == 0:
                continue
            exact = rows[i] % EVERY == 1
            phash[i], thumb[i] = phash[i - 1], thumb[i - 1]
            if exact:
                sha[i] = sha[i - 1]
            else:
                phash[i, 0] ^= 1
            planted[f"k{rows[i]:08d}"] = (f"k{rows[i - 1]:08d}", "exact" if exact else "near")
        table = pa.table({"key": [f"k{r:08d}" for r in rows], "image_sha": sha,
                          "caption_sha": [f"{r:064x}" for r in rows],
                          "phash": _fixed(phash), "thumb": _fixed(thumb).cast(pa.binary())}, schema=SCHEMA)
        made = made_from(shard)
        path = part_path(out / "_parts", shard)
        pq.write_table(table.replace_schema_metadata(
            {b"halsift": json.dumps({"shard": str(shard), **made, "skipped": {}}).encode()}), path)
        part_done(path.parent, path.name, made)  # as hash_shard records it: reused by run_dedup
    return corpus, out, planted


def _fixed(a: np.ndarray):
    import pyarrow as pa

    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(a.shape[1]), len(a), [None, pa.py_buffer(a.tobytes())])


def write_against(root: Path) -> Path:
    """``root/against``: 20 random images (an image folder for ``--against``; nothing in the corpus matches)."""
    from PIL import Image

    folder = root / "against"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(20):
        Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)).save(folder / f"e{i:02d}.png")
    return folder


def _child(corpus: str, out: str, against: str) -> None:
    from halsift.filtering.curation.dedup import run_dedup

    m = run_dedup(corpus, out, against=[against], show_progress=False)
    m["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(m))


def run(n: int, work: Path) -> dict:
    root = work / f"n{n}"
    shutil.rmtree(root, ignore_errors=True)
    corpus, out, planted = write_parts(root, n)
    against = write_against(root)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, __file__, "--child", str(corpus), str(out), str(against)],
                         capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    m = json.loads(res.stdout.strip().splitlines()[-1])
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "duplicates.parquet").to_pylist()
    found = {r["key"]: (r["matched"], r["reason"]) for r in rows}
    shutil.rmtree(root, ignore_errors=True)
    return {"samples": n, "wall_s": round(wall, 1), "peak_rss_mb": round(m["peak_rss_mb"], 1),
            "timing_s": m["timing_s"], "planted_found_exactly": found == planted, "listed": len(found),
            "planted": len(planted)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--work", help="working folder (default: a temporary one)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(*a.child)
        return 0
    work = Path(a.work or tempfile.mkdtemp(prefix="halsift-dedup-parts-"))
    results = []
    for n in a.sizes:
        results.append(run(n, work))
        print(json.dumps(results[-1]), flush=True)
    if len(results) > 1:
        print(json.dumps({"samples_ratio": results[-1]["samples"] / results[0]["samples"],
                          "rss_ratio": round(results[-1]["peak_rss_mb"] / results[0]["peak_rss_mb"], 2),
                          "rss_mb_per_million_above_smallest": round(
                              (results[-1]["peak_rss_mb"] - results[0]["peak_rss_mb"])
                              / ((results[-1]["samples"] - results[0]["samples"]) / 1e6), 1)}))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["planted_found_exactly"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
