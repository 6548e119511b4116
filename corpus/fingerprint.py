"""Content fingerprints for reuse decisions: a rerun reuses a cached result only if what it was made from is
unchanged (DESIGN.md, "Reuse is content-addressed").

A file's fingerprint is its size, its mtime (ns) and a BLAKE2b hash of sampled blocks (the first and last
64 KiB and 16 evenly spaced 4 KiB blocks): cheap for multi-GB shards, and any replaced file changes its mtime or
size or one of the sampled blocks. A copy that does not preserve mtimes counts as changed (a rescore, never a
stale reuse). Small files (up to 1 MiB) are hashed whole, and so is every file with ``full=True`` (``halsift score
--full-hash``: a change outside the sampled blocks that keeps size and mtime is then seen too); such a fingerprint
says ``"full": true`` and is compared only with one made the same way (:func:`refingerprint`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

_WHOLE = 1 << 20
_EDGE = 64 << 10
_BLOCK = 4 << 10
_SAMPLES = 16
_MAX_DIR_FILES = 5000


def file_fingerprint(path: str | os.PathLike, full: bool = False) -> dict:
    """``{"size", "mtime_ns", "hash"}`` of one regular file (hashed whole with ``full``: then also ``"full":
    true``, for files over 1 MiB)."""
    path = Path(path)
    st = path.stat()
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if full and st.st_size > _WHOLE:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
            return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "hash": h.hexdigest(), "full": True}
        if st.st_size <= _WHOLE:
            h.update(f.read())
        else:
            offsets = [0, st.st_size - _EDGE] + [st.st_size * i // (_SAMPLES + 1) for i in range(1, _SAMPLES + 1)]
            for off in offsets:
                f.seek(off)
                h.update(f.read(_EDGE if off in (0, st.st_size - _EDGE) else _BLOCK))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "hash": h.hexdigest()}


def refingerprint(path: str | os.PathLike, recorded: dict) -> dict:
    """The fingerprint of ``path`` now, made the way ``recorded`` was (whole when it says ``full``)."""
    return file_fingerprint(path, full=bool(recorded.get("full")))


def path_fingerprint(path: str | os.PathLike) -> str:
    """One hex digest over a file or every file under a folder (names relative to it, sorted)."""
    path = Path(path)
    h = hashlib.blake2b(digest_size=16)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())[:_MAX_DIR_FILES]
    for f in files:
        rel = "." if f == path else str(f.relative_to(path))
        h.update(json.dumps([rel, file_fingerprint(f)], sort_keys=True).encode())
    return h.hexdigest()


def spec_fingerprint(spec: str) -> str:
    """A detector spec plus the content of every existing file or folder it names (checkpoint, adapter, base)."""
    h = hashlib.blake2b(spec.encode(), digest_size=16)
    for tok in dict.fromkeys(re.split(r"[,;=\[\]]", spec)):
        if tok and os.path.exists(tok):
            h.update(tok.encode() + b"\0" + path_fingerprint(tok).encode())
    return h.hexdigest()
