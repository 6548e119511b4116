"""Atomic writes: every file halsift writes goes to a temporary name beside its target and is renamed into place
when complete, so a killed or failed run never leaves a half-written file that looks finished (and a failure
removes the temporary file). One helper for all writers: JSON, parquet parts, JSONL, plots, reports, npz. An error
that names no file (a full disk) leaves it naming the file being written."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def naming_errors(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise an ``OSError`` that names no file as the same error naming ``path``: a full disk (ENOSPC), a
    quota or an I/O error surfaces from ``write`` without a file name, and the CLI prints an OSError's name and
    reason in one line (``PATH: No space left on device``)."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        reason = os.strerror(e.errno) if e.errno else (str(e) or type(e).__name__)
        raise OSError(e.errno, reason, str(path)) from e


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (ending in ``suffix``, e.g. ``.png`` for writers that read the
    format from the name); on normal exit rename it onto ``path``, on an error remove it. An ``OSError`` that names
    no file (a full disk) is re-raised naming ``path`` (:func:`naming_errors`)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{suffix}")
    try:
        with naming_errors(path):
            yield tmp
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only still there when writing failed


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, creating its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path
