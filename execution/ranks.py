"""Processes and devices: a launch's ranks as a :class:`~halsift.execution.job.Place` (accelerate's
``PartialState``: ``torchrun``/``accelerate launch``, any number of nodes; gloo on CPU), and the device a lone task or
Ray actor uses. torch and accelerate are imported only here, when a job runs."""

from __future__ import annotations

import os

from halsift.execution.claims import dist_timeout_kwargs
from halsift.execution.job import Place


def accelerate_state(device: str | None):
    """The launch's accelerate state. CPU (gloo) unless a CUDA device is asked for or present: without ``cpu=True``
    accelerate does not join a CPU-only torchrun group and every rank would think it is alone."""
    import torch
    from accelerate import PartialState

    cpu = device == "cpu" or (device is None and (not torch.cuda.is_available() or bool(os.environ.get(
        "HALSIFT_FORCE_CPU"))))
    return PartialState(cpu=cpu, **dist_timeout_kwargs())  # HALSIFT_DIST_TIMEOUT: barrier timeout in seconds


def rank_place(device: str | None) -> Place:
    """This process's place among the launch's ranks (one process: rank 0 of 1), on ``device`` or the launch's."""
    state = accelerate_state(device)
    return Place(state.process_index, state.num_processes, device or str(state.device), state)


def task_device() -> str:
    """A task's (or Ray actor's) device: its first visible GPU, or the CPU when there is none or HALSIFT_FORCE_CPU is
    set."""
    import torch

    return "cuda" if torch.cuda.is_available() and not os.environ.get("HALSIFT_FORCE_CPU") else "cpu"


__all__ = ["accelerate_state", "rank_place", "task_device"]
