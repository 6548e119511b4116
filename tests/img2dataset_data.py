"""Shards in img2dataset's ``--output_format webdataset`` layout, written with webdataset's own TarWriter.

img2dataset names shards ``{shard_id:05d}.tar``, keys ``{shard_id:05d}{index:04d}`` (9 digits), writes
``<key>.jpg``, ``<key>.txt`` (the caption column) and ``<key>.json`` (``url, key, status, error_message, width,
height, original_width, original_height, exif, sha256, caption``; no ``captioner``/``source``), and beside each
shard a ``_stats.json`` and a ``.parquet`` of the same metadata; there is no ``sizes.json``.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import webdataset as wds
from PIL import Image


def jpeg(rng: random.Random, size: int = 32) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), tuple(rng.randrange(256) for _ in range(3))).save(buf, "JPEG")
    return buf.getvalue()


def make_img2dataset(out: Path, shards: int = 2, per_shard: int = 4, seed: int = 0, extra: dict | None = None,
                     first_shard: int = 0, uid: bool = False) -> Path:
    """Write ``shards`` x ``per_shard`` successful downloads (shard ids from ``first_shard``); ``extra`` adds
    fields to every json; ``uid`` adds DataComp's ``uid`` (32 hex digits, here the md5 of the url)."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for sid in range(first_shard, first_shard + shards):
        rows = []
        with wds.TarWriter(str(out / f"{sid:05d}.tar")) as w:
            for i in range(per_shard):
                key = f"{sid:05d}{i:04d}"
                caption = f"A red dog number {n} on the grass. A blue car behind it."
                meta = {"url": f"https://example.com/img/{n}.jpg", "key": key, "status": "success",
                        "error_message": None, "width": 32, "height": 32, "original_width": 640,
                        "original_height": 480, "exif": "{}", "sha256": f"{n:064x}", "caption": caption,
                        **(extra or {})}
                if uid:
                    meta["uid"] = hashlib.md5(meta["url"].encode()).hexdigest()
                w.write({"__key__": key, "jpg": jpeg(rng), "txt": caption, "json": meta})
                rows.append(meta)
                n += 1
        pq.write_table(pa.Table.from_pylist(rows), out / f"{sid:05d}.parquet")
        (out / f"{sid:05d}_stats.json").write_text(json.dumps(
            {"count": per_shard, "successes": per_shard, "failed_to_download": 0, "failed_to_resize": 0}))
    return out
