"""Small slices of the session's synthetic world for the LoRA detector tests (copied, never modified in place)."""

from __future__ import annotations

import shutil
from pathlib import Path

from halsift.corpus.bench import read_bench, write_bench
from halsift.corpus.shards import Sample, ShardWriter, iter_samples


def small_bench(world: Path, out: Path, captions: dict[str, int]) -> Path:
    """The first ``captions[split]`` captions of each split of the world's bench (rows + their images)."""
    rows = read_bench(world / "bench" / "bench.jsonl")
    keep: dict[str, list[str]] = {s: [] for s in captions}
    for r in rows:
        ids = keep.get(r.split)
        if ids is not None and r.caption_id not in ids and len(ids) < captions[r.split]:
            ids.append(r.caption_id)
    chosen = {c for ids in keep.values() for c in ids}
    sub = [r for r in rows if r.caption_id in chosen]
    (out / "images").mkdir(parents=True, exist_ok=True)
    for r in sub:
        dst = out / r.image
        if not dst.exists():
            shutil.copyfile(world / "bench" / r.image, dst)
    write_bench(out / "bench.jsonl", sub)
    return out / "bench.jsonl"


def small_shards(world: Path, out: Path, n: int = 6) -> Path:
    """One shard with the first ``n`` corpus samples (ground-truth sentences included)."""
    with ShardWriter(out, maxcount=n) as w:
        for i, s in enumerate(iter_samples(world / "corpus")):
            if i == n:
                break
            w.write(Sample(s.key, s.image, s.caption, {k: v for k, v in s.meta.items() if k != "key"}, s.ext))
    return out
