"""Curation: exact and near-duplicate removal and evaluation decontamination (``halsift dedup``; docs/curation.md).

:func:`~halsift.filtering.curation.dedup.run_dedup` writes ``DIR/duplicates.parquet`` (key, group, reason in
{exact, near, eval}, matched, similarity) and ``DIR/manifest.json``; :func:`excluded_keys` is what selection reads.
"""

from __future__ import annotations

import os
from pathlib import Path

DUPLICATES = "duplicates.parquet"
COLUMNS = ("key", "group", "reason", "matched", "similarity")
REASONS = ("exact", "near", "eval")


def excluded_keys(dup_dir: str | os.PathLike) -> set[str]:
    """The corpus keys a dedup folder (or its ``duplicates.parquet``) removes: every listed row (each duplicate
    group's representative is not listed, so it stays)."""
    import pyarrow.parquet as pq

    path = Path(dup_dir)
    if path.is_dir():
        path = path / DUPLICATES
    if not path.is_file():
        raise FileNotFoundError(f"dedup: {path} does not exist (expected a folder written by `halsift dedup`)")
    return set(pq.read_table(path, columns=["key"]).column("key").to_pylist())


__all__ = ["COLUMNS", "DUPLICATES", "REASONS", "excluded_keys"]
