"""Selection at scale: the top 20% of 10 million (or 100 million) score rows spread over many parquet parts.

    python benchmarks/select_scale.py                                 # 10M rows, 200 parts, out-of-core (DuckDB)
    python benchmarks/select_scale.py --rows 100000000 --parts 2000   # the 100M case
    python benchmarks/select_scale.py --engine arrow                  # the in-memory select_keys, to compare

Generates the score folder with its ``_manifest.json`` (not timed), then times, in a fresh process, the folder
check every select runs first (:func:`halsift.filtering.selection.score_folder.check_score_folder`: manifest, footers,
detectors) and the selection plus writing ``kept.parquet``, and prints wall times and that process's peak RSS
(target: 100M rows under 2 GB). ``duckdb`` is :func:`halsift.filtering.selection.out_of_core.top_keys` (what ``select
--resumable`` / ``--keys-only`` run; memory limit ``--memory-limit``); ``arrow`` is
:func:`halsift.filtering.selection.select.select_keys`, which holds the score columns in memory.
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
    write_manifest(out)


def write_manifest(out: Path) -> None:
    """The ``_manifest.json`` a finished ``halsift score`` leaves (the fields select checks)."""
    from halsift.corpus.shards import write_json_atomic
    from halsift.filtering.scoring.part_records import RECORDS, part_record

    parts = sorted(p.name for p in out.glob("part-*.parquet"))
    write_json_atomic(out / "_manifest.json", {"detector": "clip:arch=ViT-B-32", "detector_name": "clip:arch=ViT-B-32",
                                               "unit": "sentence", "status": "complete", "parts": len(parts),
                                               "part_files": parts, RECORDS: {p: part_record(out / p) for p in parts}})


def measure(scores: Path, keep: float, unit: str, agg: str, engine: str, memory_limit: str) -> None:
    from halsift.corpus.scores import write_part_atomic
    from halsift.filtering.selection.score_folder import check_score_folder

    t0 = time.perf_counter()
    folder = check_score_folder(scores)
    t_check = time.perf_counter() - t0
    if engine == "duckdb":
        from halsift.filtering.selection.out_of_core import top_keys

        info = top_keys(scores, scores.parent / f"kept-{unit}", keep=keep, unit=unit, agg=agg,
                        memory_limit=memory_limit)
    else:
        from halsift.filtering.selection.select import select_keys

        kept, info = select_keys(scores, keep=keep, unit=unit, agg=agg)
        write_part_atomic(kept, scores.parent / f"kept-{unit}.parquet")
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{engine} unit={unit}{'/' + agg if unit == 'caption' else ''}: candidates {info['candidates']:,}, kept "
          f"{info['selected']:,} (threshold {info['threshold_used']}) in {wall:.1f} s (folder check of "
          f"{len(folder.parts)} parts {t_check:.1f} s), peak RSS {rss:.0f} MB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--parts", type=int, default=200)
    p.add_argument("--keep", type=float, default=0.2)
    p.add_argument("--caption", action="store_true", help="also time caption-level selection (agg=min)")
    p.add_argument("--engine", choices=("duckdb", "arrow"), default="duckdb",
                   help="duckdb: out-of-core top_keys (default); arrow: the in-memory select_keys")
    p.add_argument("--memory-limit", default="128MB", help="duckdb's memory limit (it spills beyond it; select's default)")
    p.add_argument("--dir", default=None, help="keep the generated scores here (reused when present)")
    p.add_argument("--_measure", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_unit", default="sentence", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._measure:
        measure(Path(a._measure), a.keep, a._unit, "min", a.engine, a.memory_limit)
        return 0
    tmp = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="halsift-select-scale-"))
    try:
        t0 = time.perf_counter()
        if not (tmp / "scores").is_dir():
            generate(tmp / "scores", a.rows, a.parts)
        elif not (tmp / "scores" / "_manifest.json").exists():  # a folder generated before manifests were
            write_manifest(tmp / "scores")
        size = sum(f.stat().st_size for f in (tmp / "scores").glob("*.parquet")) / 2**20
        print(f"{a.rows:,} score rows in {a.parts} parts ({size:.0f} MB), generated in "
              f"{time.perf_counter() - t0:.1f} s")
        for unit in ["sentence"] + (["caption"] if a.caption else []):
            subprocess.run([sys.executable, __file__, "--_measure", str(tmp / "scores"), "--keep", str(a.keep),
                            "--_unit", unit, "--engine", a.engine, "--memory-limit", a.memory_limit], check=True)
    finally:
        if not a.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
