"""One run per output folder: ``halsift <command> --out DIR`` holds an exclusive lock on ``DIR/.halsift.lock``
while it runs, so a second run into the same folder stops at once with a one-line error instead of interleaving
its parts, shards or checkpoints with the first one's.

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

    folder = Path(out)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise OutputBusyError(f"--out {folder}: another halsift run is writing into this folder (it holds "
                              f"{folder / LOCK_NAME}); wait for it to finish or choose another --out") from None
    try:
        yield
    finally:
        lock.release()
        with contextlib.suppress(OSError):
            (folder / LOCK_NAME).unlink()
            if created and not any(folder.iterdir()):
                folder.rmdir()  # a run that failed before writing anything leaves no empty folder behind
