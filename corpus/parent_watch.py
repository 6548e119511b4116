"""Worker processes that do not outlive their parent.

A ``torch.utils.data`` worker notices a dead parent only between batches (its watchdog polls every 5 s), and then
cannot exit: its queue's feeder thread blocks on a full pipe that nobody reads, and the exit waits for that thread,
so a killed ``halsift score --decode-workers N`` left its workers (~0.5 GB each) running for good. Here a worker
asks Linux to SIGKILL it when its parent dies (``prctl(PR_SET_PDEATHSIG)``); where that is not available a daemon
thread polls ``os.getppid()`` and ends the process with ``os._exit``. Both kill outright (no clean-up runs), which is
what a worker whose results can no longer be delivered needs: halsift's outputs are written atomically by the parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.5  # the fallback's polling interval


def _pdeathsig() -> bool:
    """Ask the kernel to SIGKILL this process when the thread that forked it exits; whether that worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _poll(parent_pid: int, poll_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    os._exit(1)


def exit_with_parent(parent_pid: int, use_prctl: bool = True, poll_s: float = POLL_S) -> str:
    """Make this process end when ``parent_pid`` (the process that started it) dies; returns how: ``"prctl"`` or
    ``"poll"`` (a daemon thread). Exits at once when the parent is already gone."""
    how = "prctl" if use_prctl and _pdeathsig() else "poll"
    if os.getppid() != parent_pid:  # died before the request above could cover it
        os._exit(1)
    if how == "poll":
        threading.Thread(target=_poll, args=(parent_pid, poll_s), name="halsift-parent-watch", daemon=True).start()
    return how


class ExitWithParent:
    """A ``DataLoader`` ``worker_init_fn``: the worker ends when the process that built the loader dies (picklable,
    so it works with the fork and spawn start methods alike)."""

    def __init__(self) -> None:
        self.parent_pid = os.getpid()

    def __call__(self, worker_id: int) -> None:
        exit_with_parent(self.parent_pid)


__all__ = ["ExitWithParent", "exit_with_parent"]
