"""One run per output folder: ``halsift <command> --out DIR`` holds an exclusive lock on ``DIR/.halsift.lock``
while it runs, so a second run into the same folder stops at once with a one-line error instead of interleaving
its parts, shards or checkpoints with the first one's. An ``--out`` that names a file (``convert coco ... --out
set.jsonl``) is locked by the sibling ``set.jsonl.halsift.lock``.

The lock is an OS file lock (``filelock``, ``flock`` on Unix): the kernel drops it when the holder exits, even on
SIGKILL, so a killed run never leaves a stale lock behind. Under torchrun/accelerate only rank 0 (``RANK`` unset or
0) takes it; the other ranks of that run write into the folder rank 0 claimed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".halsift.lock"


class OutputBusyError(RuntimeError):
    """Another halsift run is writing into the same output folder."""


@contextlib.contextmanager
def output_lock(out: str | os.PathLike | None, command: str) -> Iterator[None]:
    """Hold the lock of folder ``out`` (created if needed) for the duration; no-op for ``None`` or rank > 0."""
    if out is None or os.environ.get("RANK", "0") not in ("", "0"):
        yield
        return
    from filelock import FileLock, Timeout

    target = Path(out)
    # an output *file* (e.g. `convert coco ... --out set.jsonl`) is locked by a sibling file, never made a folder
    as_file = target.is_file() or (not target.is_dir() and target.suffix != "")
    folder = target.parent if as_file else target
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = target.with_name(target.name + LOCK_NAME) if as_file else folder / LOCK_NAME
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise OutputBusyError(f"--out {target}: another halsift run is writing into it (it holds {path}); wait for "
                              "it to finish or choose another --out") from None
    try:
        yield
    finally:
        lock.release()
        with contextlib.suppress(OSError):
            path.unlink()
            if created and not as_file and not any(folder.iterdir()):
                folder.rmdir()  # a run that failed before writing anything leaves no empty folder behind
