"""Selection at scale: the top 20% of 10 million score rows spread over many parquet parts.

    python benchmarks/select_scale.py                 # 10M rows, 200 parts
    python benchmarks/select_scale.py --rows 1000000  # smaller

Generates the score folder (not timed), then times :func:`halsift.filtering.select.select_keys` plus writing
``kept.parquet`` in a fresh process and prints wall time and that process's peak RSS (target: < 30 s, < 2 GB).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def generate(out: Path, rows: int, parts: int, sentences_per_caption: int = 3, seed: int = 0) -> None:
    """Score parts with keys ``<part>_<caption>``, 3 sentences per caption, float32 scores with some ties."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from halsift.corpus.scores import write_part_atomic

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = -(-rows // parts)
    done = 0
    for p in range(parts):
        n = min(per, rows - done)
        if n <= 0:
            break
        cap = np.arange(n) // sentences_per_caption
        keys = pc.binary_join_element_wise(f"{p:06d}", pc.cast(pa.array(cap), pa.string()), "_")
        score = np.round(rng.beta(5, 2, n) * 100, 2).astype(np.float32)  # 2 decimals: realistic ties
        t = pa.table({"key": keys, "sentence_index": pa.array((np.arange(n) % sentences_per_caption).astype(np.int32)),
                      "score": score, "parsed": pa.array(np.ones(n, bool)),
                      "detector": pa.array(["clip:arch=ViT-B-32"] * n).dictionary_encode().cast(pa.string())})
        write_part_atomic(t, out / f"part-{p:06d}.parquet")
        done += n


def measure(scores: Path, keep: float, unit: str, agg: str) -> None:
    from halsift.corpus.scores import write_part_atomic
    from halsift.filtering.select import select_keys

    t0 = time.perf_counter()
    kept, info = select_keys(scores, keep=keep, unit=unit, agg=agg)
    write_part_atomic(kept, scores.parent / f"kept-{unit}.parquet")
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"unit={unit}{'/' + agg if unit == 'caption' else ''}: candidates {info['candidates']:,}, kept "
          f"{info['selected']:,} (threshold {info['threshold_used']}) in {wall:.1f} s, peak RSS {rss:.0f} MB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--parts", type=int, default=200)
    p.add_argument("--keep", type=float, default=0.2)
    p.add_argument("--caption", action="store_true", help="also time caption-level selection (agg=min)")
    p.add_argument("--_measure", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_unit", default="sentence", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._measure:
        measure(Path(a._measure), a.keep, a._unit, "min")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="halsift-select-scale-"))
    try:
        t0 = time.perf_counter()
        generate(tmp / "scores", a.rows, a.parts)
        size = sum(f.stat().st_size for f in (tmp / "scores").glob("*.parquet")) / 2**20
        print(f"generated {a.rows:,} score rows in {a.parts} parts ({size:.0f} MB) in {time.perf_counter() - t0:.1f} s")
        for unit in ["sentence"] + (["caption"] if a.caption else []):
            subprocess.run([sys.executable, __file__, "--_measure", str(tmp / "scores"), "--keep", str(a.keep),
                            "--_unit", unit], check=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
