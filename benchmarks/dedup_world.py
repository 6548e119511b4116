"""Decontamination and exact dedup on a synthetic world with planted leaks: leak recall, clean corpus removed,
exact copies found (docs/curation.md; thresholds were chosen on seed 1, this defaults to held-out seed 7).

    .venv/bin/python benchmarks/dedup_world.py --seed 7 --images 9000 --leaks 0.75 --exact-copies 60

Measured (docs/curation.md): seed 7: leak recall 100% (300/300), clean removed 0.28% (25/9000), exact 60/60;
seed 23: 100% (300/300), 0.26% (23/9000), 60/60.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq


def measure(world_dir: Path, out: Path) -> dict:
    """Compare ``out/duplicates.parquet`` with the world's ground truth."""
    world = json.loads((world_dir / "world.json").read_text())
    rows = pq.read_table(out / "duplicates.parquet").to_pylist()
    manifest = json.loads((out / "manifest.json").read_text())
    leaks, copies = world.get("leaks", {}), world.get("exact_copies", {})
    evals = {r["key"]: r["matched"] for r in rows if r["reason"] == "eval"}
    exact = {r["key"]: r["matched"] for r in rows if r["reason"] == "exact"}
    planted = set(leaks) | set(copies)
    clean = manifest["samples"] - len(planted)
    clean_removed = sum(r["key"] not in planted for r in rows)
    return {"leaks": len(leaks), "leak_recall_pct": round(100 * sum(evals.get(k) == v for k, v in leaks.items())
                                                          / max(1, len(leaks)), 2),
            "clean": clean, "clean_removed": clean_removed, "clean_removed_pct": round(100 * clean_removed / clean, 2),
            "exact_copies": len(copies), "exact_found": sum(exact.get(k) == v for k, v in copies.items()),
            "counts": manifest["counts"], "thresholds": manifest["thresholds"], "timing_s": manifest["timing_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--images", type=int, default=9000)
    ap.add_argument("--leaks", type=float, default=0.75, help="share of the retrieval images leaked")
    ap.add_argument("--exact-copies", type=int, default=60)
    ap.add_argument("--retrieval-images", type=int, default=400)
    ap.add_argument("--bench-images", type=int, default=300)
    a = ap.parse_args()
    from halsift.filtering.curation.dedup import run_dedup
    from halsift.synth.world import generate_world

    with tempfile.TemporaryDirectory() as tmp:
        w = Path(tmp) / "world"
        generate_world(w, images=a.images, seed=a.seed, leaks=a.leaks, exact_copies=a.exact_copies,
                       retrieval_images=a.retrieval_images, bench_images=a.bench_images, t2i_prompts=0,
                       pretrain_images=0, captioners=["share-sim"], corpus_sentences=[2, 3])
        t0 = time.time()
        run_dedup(str(w / "corpus"), Path(tmp) / "dedup", against=[str(w / "retrieval"), str(w / "bench")],
                  show_progress=False)
        print(json.dumps({"seed": a.seed, "wall_s": round(time.time() - t0, 1),
                          **measure(w, Path(tmp) / "dedup")}))


if __name__ == "__main__":
    main()
