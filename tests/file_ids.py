"""What a rewrite changes, for tests that a finished part is reused as it is (never remade)."""

from __future__ import annotations

from pathlib import Path


def file_id(f: Path) -> tuple[int, int]:
    """``(inode, mtime_ns)``: an atomic rewrite (a new file renamed over the old) changes both."""
    st = f.stat()
    return st.st_ino, st.st_mtime_ns


def file_ids(folder: Path, pattern: str = "part-*.parquet", records: bool = True) -> dict[str, tuple]:
    """Per file of ``folder`` matching ``pattern``, its :func:`file_id`, with its ``_done/<name>.json`` record's
    (:mod:`halsift.execution.run_folder`) when ``records``."""
    return {p.name: (file_id(p), file_id(folder / "_done" / f"{p.name}.json")) if records else file_id(p)
            for p in sorted(folder.glob(pattern))}
