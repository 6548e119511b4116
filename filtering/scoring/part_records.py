"""What a score folder records of each finished part, so that readers can tell the part ``halsift score`` wrote from
one altered, swapped or replaced since (select checks it: :mod:`halsift.filtering.selection.score_folder`)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq

from halsift.corpus.fingerprint import file_fingerprint
from halsift.execution.run_folder import content as whole_content

PART_META_KEY = b"halsift"  # a part's own stats in its parquet metadata (halsift.filtering.scoring.runner writes them)
RECORDS = "part_records"  # the score manifest's per-part record: size, content hash, rows, repeated rows


def content(p: Path) -> dict:
    """A part's size and content hash (:func:`file_fingerprint` without the mtime: a copy is the same part)."""
    fp = file_fingerprint(p)
    return {"size": fp["size"], "hash": fp["hash"]}


def part_record(p: str | os.PathLike) -> dict:
    """What ``halsift score`` records of a finished part in its manifest (``part_records``) and select checks: size,
    content hash (of the whole file: ``whole``; older records hash sampled blocks, :func:`content`), rows and how
    many rows repeat a (key, sentence_index) of the part."""
    p = Path(p)
    t = pq.read_table(p, columns=["key", "sentence_index"])
    distinct = len(t.group_by(["key", "sentence_index"], use_threads=False).aggregate([]))
    return {**whole_content(p), "whole": True, "rows": len(t), "repeated_rows": len(t) - distinct}


def matches(p: str | os.PathLike, record: dict, now: dict | None = None) -> bool:
    """Whether part ``p`` still has the size and hash ``record`` holds (hashed as the record was: whole or sampled;
    ``now``: its sampled :func:`content`, when already computed)."""
    if record.get("whole"):
        now = whole_content(p)
    elif now is None:
        now = content(Path(p))
    return (record.get("size"), record.get("hash")) == (now["size"], now["hash"])
