"""Per-shard descriptor parts (``DIR/_parts/part-<shard>.parquet``): one row per valid sample, in shard order.

Columns: key, image_sha, caption_sha (hex sha256 of the bytes / normalized caption), phash (8 bytes), thumb
(12x12x3 uint8 bytes). A part is written atomically once its shard is read, with the shard's skipped samples in
its footer, so a killed ``dedup`` resumes at the first missing part. A part is reused only when its shard has the
content fingerprint it was made from and the part is unaltered since (:mod:`halsift.execution.run_folder`); a part of
an older folder, which recorded the shard's size and mtime only, is made again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from halsift.corpus.fingerprint import file_fingerprint
from halsift.corpus.images import SkipCounter
from halsift.execution.run_folder import forget_part, part_done, part_reusable
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
    made = made_from(shard)
    meta = {"shard": str(shard), **made, "skipped": skipped.to_json()}
    table = table.replace_schema_metadata({b"halsift": json.dumps(meta, sort_keys=True).encode()})
    forget_part(out.parent, out.name)
    write_part_atomic(table, out)
    part_done(out.parent, out.name, made)
    return skipped


def made_from(shard: Path) -> dict:
    """What a part is made from: its shard's content fingerprint (:mod:`halsift.corpus.fingerprint`)."""
    return {"source_fp": file_fingerprint(shard)}


def part_is_current(path: Path, shard: Path) -> bool:
    """The part exists, was made from this content of ``shard`` and is unaltered since."""
    return part_reusable(path.parent, path.name, made_from(shard))


def read_part(path: Path) -> tuple[pa.Table, SkipCounter]:
    t = pq.read_table(path)
    meta = json.loads((t.schema.metadata or {}).get(b"halsift", b"{}"))
    return t, SkipCounter.from_json(meta.get("skipped", {}))


# ------------------------------------------------------------------------------------------------ on the engines
def shard_stage(shards: list[Path], out: Path, model: str | None, show_progress: bool, engine: str = "local",
                **flags):
    """Dedup's per-shard part (descriptor parts, and with ``model`` embedding parts in ``out/embeddings``) as a job
    of the execution layer (:class:`~halsift.execution.stage_job.StageJob`) on ``engine`` with its ``flags``.
    Returns the engine's summary (``stats``: parts made and reused); a task run's summary says whether the folder's
    parts are complete (a plain run afterwards does the global part)."""
    from halsift.corpus.fingerprint import spec_fingerprint
    from halsift.execution.engines import run_job
    from halsift.execution.stage_job import StageJob, StagePart

    model_fp = spec_fingerprint(model) if model else None
    parts = [StagePart(part_path(out / "_parts", s).name, (Path(s), out, model, model_fp)) for s in shards]
    (out / "_parts").mkdir(parents=True, exist_ok=True)
    return run_job(StageJob("dedup", out / "_parts", parts, _make_shard_parts, _shard_parts_done,
                            show_progress=show_progress, **flags), engine)


def _shard_parts_done(part) -> bool:
    shard, out, model, model_fp = part.args
    path = part_path(out / "_parts", shard)
    if not part_is_current(path, shard):
        return False
    if model is None or pq.ParquetFile(path).metadata.num_rows == 0:  # no valid image: no embedding part
        return True
    from halsift.filtering.curation.encode import embedding_made_from

    return part_reusable(out / "embeddings", path.name, embedding_made_from(shard, model_fp))


def _make_shard_parts(part) -> None:
    shard, out, model, model_fp = part.args
    path = part_path(out / "_parts", shard)
    if not part_is_current(path, shard):
        hash_shard(shard, path)
    if model is not None:
        from halsift.filtering.curation.encode import cached_encoder, encode_shard

        encode_shard(shard, out / "embeddings", cached_encoder(model), model_fp)
