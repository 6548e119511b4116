"""Run records as files: a folder's JSON record, a file's whole-content identity (size and hash, no mtime: a copy is
the same file) and the record of a finished part (``<folder>/_done/<part>.json``). The rules built on them (identity,
reuse, claims, status) are the execution layer's (:mod:`halsift.execution.run_folder`); readers of stored data in
this layer (the embedding store) check parts with these alone."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from halsift.corpus.errors import InputError
from halsift.corpus.fingerprint import file_fingerprint

DONE = "_done"  # one record per finished part: <folder>/_done/<part>.json


class RunFolderError(InputError):
    """A folder that holds another run's output, or is not a run folder (one line naming it and the key)."""


def read_record(path: str | os.PathLike, error: type[Exception] = RunFolderError, prefix: str = "",
                hint: str = "remove the folder or choose another") -> dict | None:
    """The JSON object at ``path`` (a folder's manifest or settings); ``None`` when there is none; ``error`` (one
    line, after ``prefix``) when it is not a JSON object."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise error(f"{prefix}{path} is not readable JSON ({e}); {hint}") from None
    if not isinstance(value, dict):
        raise error(f"{prefix}{path} is not a JSON object; {hint}")
    return value


def content(path: str | os.PathLike) -> dict:
    """``{"size", "hash"}`` of a file hashed whole (a part as written; the mtime is not part of it: a copy is the
    same part). The hash is remembered for this version of the file (:func:`has_content` does not hash a part this
    process just recorded a second time)."""
    before = os.stat(path)
    fp = file_fingerprint(path, full=True)
    if _version(path, os.stat(path)) == _version(path, before):
        _verified[(*_version(path, before), fp["hash"])] = True
    return {"size": fp["size"], "hash": fp["hash"]}


def _version(path: str | os.PathLike, st: os.stat_result) -> tuple:
    return os.fspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


# (path, size, mtime_ns, ctime_ns, inode, hash) -> matches: one hash per file version and process (any write changes
# the ctime, which no one can set back)
_verified: dict[tuple, bool] = {}


def has_content(path: str | os.PathLike, record: Mapping) -> bool:
    """Whether the file at ``path`` still has the size and whole-content hash of ``record``."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_size != record.get("size"):
        return False
    key = (*_version(path, st), record.get("hash"))
    if key not in _verified:
        _verified[key] = content(path)["hash"] == record.get("hash")
    return _verified[key]


def record_path(folder: str | os.PathLike, name: str) -> Path:
    """Where part ``name``'s record lies."""
    return Path(folder) / DONE / f"{name}.json"


def part_record(folder: str | os.PathLike, name: str) -> dict | None:
    """The record :func:`halsift.execution.run_folder.part_done` wrote for part ``name`` (``None`` when there is none or it is unreadable)."""
    try:
        rec = json.loads(record_path(folder, name).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


__all__ = ["DONE", "RunFolderError", "content", "has_content", "part_record", "read_record", "record_path"]
