"""Torch's intra-op threads beside decode workers: the cores a scoring process has, minus its decode workers.

Torch starts one intra-op thread per core; with decode workers on the same cores the two fight (measured on 2 cores:
5.8k sentences/s with torch's default threads and one decode worker, 11.7k with one torch thread; issue 34). So while
decode workers run, and unless the user chose the thread count (``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set),
the scoring process uses ``max(1, cores - workers)`` threads, ``cores`` being the cores this process may run on
(its CPU affinity, a SLURM allocation's included) divided among the ranks of its node (``LOCAL_WORLD_SIZE``). The
setting is undone when the run ends (a library caller's process keeps its own), and the score manifest records it
(``torch_threads``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

USER_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def process_cores(env: dict | None = None) -> int:
    """The cores this process may use: its affinity set (else ``os.cpu_count()``) shared by the node's ranks."""
    env = os.environ if env is None else env
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    try:
        local = max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1))
    except ValueError:
        local = 1
    return max(1, n // local)


def threads_for(decode_workers: int, cores: int) -> int:
    """``max(1, cores - decode_workers)``: one core per decode worker, the rest for the model's threads."""
    return max(1, cores - decode_workers)


@contextlib.contextmanager
def torch_threads(decode_workers: int, cores: int | None = None, env: dict | None = None,
                  respect_env: bool = True) -> Iterator[dict]:
    """Set torch's intra-op threads for a run with ``decode_workers`` (see the module docstring) and restore them
    on exit. Yields what the manifest records: ``{"threads": N, "set_by": "halsift" | "user" | "torch"}``
    (``torch``: no decode workers, torch's default kept; ``user``: a thread variable was set, kept). ``cores``:
    the cores to share (default :func:`process_cores`); ``respect_env=False`` for a Ray actor, whose
    ``OMP_NUM_THREADS`` Ray sets, not the user."""
    import torch

    env = os.environ if env is None else env
    before = torch.get_num_threads()
    if decode_workers <= 0:
        yield {"threads": before, "set_by": "torch"}
        return
    if respect_env and any(env.get(k) for k in USER_VARS):
        yield {"threads": before, "set_by": "user"}
        return
    n = threads_for(decode_workers, process_cores(env) if cores is None else cores)
    torch.set_num_threads(n)
    try:
        yield {"threads": n, "set_by": "halsift"}
    finally:
        torch.set_num_threads(before)


__all__ = ["process_cores", "threads_for", "torch_threads"]
