"""The embedding store that ``halsift embed`` writes and CLIP-family detectors, ``dedup`` and decontamination read.

Layout of an embeddings folder ``EMB/`` (one encoding pass, shared by every filter)::

    EMB/_manifest.json        {"format": "halsift-embeddings/1", "model": SPEC, "dim": D, "dtype": "float16",
                               "normalized": true, "complete": bool, ...}
    EMB/part-<shard>.parquet  one row per embedded unit of that input shard:
                              key: string, sentence_index: int32 (-1 = the image, -2 = the whole caption,
                              0.. = that sentence), embedding: fixed_size_list<float16>[D] (L2-normalised)

One part per input shard (named like a score part), written atomically, so a killed ``embed`` resumes at the first
missing part. Parquet rather than ``.npy`` pairs: one self-describing file per part carries the keys next to the
vectors and cannot be half-written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from halsift.corpus.errors import InputError
from halsift.corpus.fingerprint import refingerprint
from halsift.corpus.records import has_content, part_record, read_record
from halsift.corpus.scores import part_name, write_part_atomic

FORMAT = "halsift-embeddings/1"
MANIFEST = "_manifest.json"
IMAGE = -1  # sentence_index of an image embedding
CAPTION = -2  # sentence_index of a whole-caption text embedding
COLUMNS = ("key", "sentence_index", "embedding")


class EmbeddingStoreError(InputError):
    """An embeddings folder or part that is not what ``halsift embed`` writes (the message names it)."""


@dataclass
class Embeddings:
    """Embeddings of one kind read from a store: ``vectors[i]`` belongs to ``(keys[i], sentence_index[i])``."""

    keys: np.ndarray  # object array of str
    sentence_index: np.ndarray  # int32
    vectors: np.ndarray  # float16 [N, D], rows L2-normalised
    model: str

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return len(self.keys)


def embedding_table(keys: Sequence[str], sentence_index: Sequence[int], vectors: np.ndarray) -> pa.Table:
    """One part's table (vectors are stored as float16, L2-normalised here)."""
    v = np.asarray(vectors, dtype=np.float32)
    if v.ndim != 2 or len(v) != len(keys) or len(keys) != len(sentence_index):
        raise ValueError(f"embedding_table: {len(keys)} keys, {len(sentence_index)} indices, vectors {v.shape}")
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    v = (v / np.where(norms > 0, norms, 1.0)).astype(np.float16)
    flat = pa.array(v.reshape(-1), pa.float16())
    return pa.table({"key": pa.array(list(keys), pa.string()),
                     "sentence_index": pa.array(list(sentence_index), pa.int32()),
                     "embedding": pa.FixedSizeListArray.from_arrays(flat, v.shape[1])})


def write_embedding_part(table: pa.Table, path: str | os.PathLike, meta: dict | None = None) -> None:
    """Write one part atomically; ``meta`` (e.g. the source and model fingerprints) goes into the parquet footer."""
    if meta:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               b"halsift": json.dumps(meta, sort_keys=True).encode()})
    write_part_atomic(table, path)


def part_meta(path: str | os.PathLike) -> dict:
    """The ``meta`` a part was written with ({} when it has none or cannot be read)."""
    try:
        raw = (pq.read_schema(path).metadata or {}).get(b"halsift")
    except (pa.ArrowInvalid, OSError):
        return {}
    return json.loads(raw) if raw else {}


def read_manifest(folder: str | os.PathLike) -> dict:
    """The folder's manifest, checked: raises :class:`EmbeddingStoreError` naming what is wrong."""
    path = Path(folder) / MANIFEST
    if not Path(folder).is_dir():
        raise EmbeddingStoreError(f"embeddings: {folder} is not a folder (expected one written by `halsift embed`)")
    if not path.exists():
        raise EmbeddingStoreError(f"embeddings: {path} is missing (expected a folder written by `halsift embed`)")
    manifest = read_record(path, EmbeddingStoreError, "embeddings: ", "rerun `halsift embed` into a new folder")
    if manifest.get("format") != FORMAT:
        raise EmbeddingStoreError(f"embeddings: {path} format is {manifest.get('format')!r}, expected {FORMAT!r}")
    for key in ("model", "dim"):
        if key not in manifest:
            raise EmbeddingStoreError(f"embeddings: {path} lacks {key!r}")
    return manifest


def part_paths(folder: str | os.PathLike) -> list[Path]:
    return sorted(p for p in Path(folder).glob("part-*.parquet"))


def _read_part(path: Path, dim: int, kind: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    try:
        t = pq.read_table(path, columns=list(COLUMNS))
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        raise EmbeddingStoreError(f"embeddings: {path} is not a readable part with columns {COLUMNS} ({e})") from e
    typ = t.schema.field("embedding").type
    if not pa.types.is_fixed_size_list(typ) or typ.list_size != dim:
        raise EmbeddingStoreError(f"embeddings: {path} column 'embedding' is {typ}, expected "
                                  f"fixed_size_list<float16>[{dim}] (the manifest's dim)")
    idx = t.column("sentence_index").to_numpy().astype(np.int32)
    keep = np.ones(len(idx), bool) if kind is None else (idx == kind) if kind < 0 else (idx >= 0)
    keys = np.asarray(t.column("key").to_pylist(), dtype=object)[keep]
    vectors = t.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
    return keys, idx[keep], vectors[keep].astype(np.float16, copy=False)


def iter_embeddings(folder: str | os.PathLike, kind: int | None = IMAGE,
                    require_complete: bool = True) -> Iterator[Embeddings]:
    """Stream the store part by part (at scale nothing needs all vectors at once). ``kind``: :data:`IMAGE`,
    :data:`CAPTION`, ``0`` (any sentence) or None (every row)."""
    manifest = read_manifest(folder)
    if require_complete and not manifest.get("complete"):
        raise EmbeddingStoreError(f"embeddings: {Path(folder) / MANIFEST} is not complete (finish `halsift embed` "
                                  "by rerunning it)")
    dim = int(manifest["dim"])
    for path in part_paths(folder):
        keys, idx, vectors = _read_part(path, dim, kind)
        yield Embeddings(keys, idx, vectors, manifest["model"])


def read_embeddings(folder: str | os.PathLike, kind: int | None = IMAGE, require_complete: bool = True) -> Embeddings:
    """Every embedding of one kind in the store, concatenated in part order."""
    manifest = read_manifest(folder)
    chunks = list(iter_embeddings(folder, kind, require_complete))
    dim = int(manifest["dim"])
    if not chunks:
        return Embeddings(np.empty(0, object), np.empty(0, np.int32), np.empty((0, dim), np.float16),
                          manifest["model"])
    return Embeddings(np.concatenate([c.keys for c in chunks]), np.concatenate([c.sentence_index for c in chunks]),
                      np.concatenate([c.vectors for c in chunks]), manifest["model"])


def check_embedded_from(folder: str | os.PathLike, shards: Sequence[Path]) -> None:
    """Refuse (one line) to read vectors of a shard whose content changed since ``halsift embed`` embedded it (its
    size or content hash differs from the fingerprint its part records; the mtime is not compared: a copy is the
    same shard), or of a part altered since it was written (:mod:`halsift.corpus.records`). Parts of older
    stores, which record neither, are read as they are."""
    for shard in shards:
        part = Path(folder) / part_name(0, Path(shard).name)
        if not part.exists():
            continue  # its samples are refused one by one when scored ("no vectors for sample ...")
        rec = part_record(folder, part.name)
        if rec is not None and not has_content(part, rec):
            raise EmbeddingStoreError(f"embeddings: {part} is not the part `halsift embed` wrote (its size or content "
                                      "hash differs from its record); rerun `halsift embed` into that folder")
        fp = part_meta(part).get("source_fp")
        if not isinstance(fp, dict) or "hash" not in fp:
            continue
        now = refingerprint(shard, fp)
        if (fp.get("size"), fp.get("hash")) != (now["size"], now["hash"]):
            raise EmbeddingStoreError(f"embeddings: {shard} changed since `halsift embed` embedded it into {folder} "
                                      "(its size or content hash differs from the fingerprint the part records); "
                                      "rerun `halsift embed` into that folder, or give the shards that were embedded")


def check_dim(emb: Embeddings, dim: int, where: str) -> None:
    """Refuse embeddings of another width than the model or index they are compared with."""
    if emb.dim != dim:
        raise EmbeddingStoreError(f"embeddings: {where} holds {emb.dim}-dimensional vectors, expected {dim} "
                                  f"(embedded by {emb.model!r}; re-embed with the same model)")


__all__ = ["CAPTION", "FORMAT", "IMAGE", "MANIFEST", "EmbeddingStoreError", "Embeddings", "check_dim",
           "check_embedded_from",
           "embedding_table", "iter_embeddings", "part_meta", "part_paths", "read_embeddings", "read_manifest",
           "write_embedding_part"]
