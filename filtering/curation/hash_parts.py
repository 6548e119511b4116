"""Per-shard descriptor parts (``DIR/_parts/part-<shard>.parquet``): one row per valid sample, in shard order.

Columns: key, image_sha, caption_sha (hex sha256 of the bytes / normalized caption), phash (8 bytes), thumb
(12x12x3 uint8 bytes). A part is written atomically once its shard is read, with the shard's skipped samples in
its footer, so a killed ``dedup`` resumes at the first missing part (a part whose shard changed since, by size or
modification time, is made again).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from halsift.corpus.images import SkipCounter
from halsift.corpus.sample import read_shard
from halsift.corpus.scores import part_name, write_part_atomic
from halsift.filtering.curation.descriptors import normalize_caption, phash_bytes, sha256_hex, thumbnail

SCHEMA = pa.schema([("key", pa.string()), ("image_sha", pa.string()), ("caption_sha", pa.string()),
                    ("phash", pa.binary(8)), ("thumb", pa.binary())])


def part_path(parts_dir: Path, shard: Path) -> Path:
    return parts_dir / part_name(0, str(shard))


def hash_shard(shard: Path, out: Path) -> SkipCounter:
    """Read ``shard`` through the one reader, write its part to ``out``; returns its skipped samples."""
    skipped = SkipCounter()
    cols: dict[str, list] = {name: [] for name in SCHEMA.names}
    for s in read_shard(shard, skipped):
        cols["key"].append(s.key)
        cols["image_sha"].append(sha256_hex(s.stored.image))
        cols["caption_sha"].append(sha256_hex(normalize_caption(s.caption)))
        cols["phash"].append(phash_bytes(s.image))
        cols["thumb"].append(thumbnail(s.image))
    table = pa.table(cols, schema=SCHEMA)
    meta = {"shard": str(shard), "stamp": shard_stamp(shard), "skipped": skipped.to_json()}
    table = table.replace_schema_metadata({b"halsift": json.dumps(meta, sort_keys=True).encode()})
    write_part_atomic(table, out)
    return skipped


def shard_stamp(shard: Path) -> list[int]:
    """``[size, mtime_ns]`` of a shard: a part made from another version of it is made again."""
    st = Path(shard).stat()
    return [st.st_size, st.st_mtime_ns]


def part_is_current(path: Path, shard: Path) -> bool:
    """The part exists and was made from this version of ``shard``."""
    if not path.exists():
        return False
    try:
        meta = json.loads((pq.read_schema(path).metadata or {}).get(b"halsift", b"{}"))
    except (pa.ArrowInvalid, OSError, ValueError):
        return False
    return meta.get("stamp") == shard_stamp(shard)


def read_part(path: Path) -> tuple[pa.Table, SkipCounter]:
    t = pq.read_table(path)
    meta = json.loads((t.schema.metadata or {}).get(b"halsift", b"{}"))
    return t, SkipCounter.from_json(meta.get("skipped", {}))
