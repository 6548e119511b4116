"""The one job shape every engine runs (DataTrove's split between an executor and its pipeline): a job is checked,
opened once per process (its folder's identity checked or started and its parts planned: :class:`Work`), and its
parts are made wherever the engine says (:mod:`.engines`). Which parts are done is the folder's own answer
(:mod:`.run_folder`: each part's content record), never the engine's; the job writes its complete record once every
part is done (:attr:`Work.finish`).

A job that runs as several jobs (a cascade's stages, a set-level ensemble's members, select's keys then its shards) is
a :class:`Pipeline`: the engine hands itself to :meth:`Pipeline.run_on`, which runs each step as an ordinary job on
that engine. Light to import (no torch).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from halsift.execution.run_folder import RunFolder

# how a job runs, not what it makes: the engine flags every per-part job may take (each job says which it honours)
ENGINE_FLAGS = ("decode_workers", "num_tasks", "task_index", "claim_timeout", "address", "workers")


@dataclass
class Place:
    """Where an opened job runs: this process's ``rank`` of ``world`` (a launch's ranks; task ``i`` of ``n``; 0 of 1
    for a Ray driver), its ``device``, and its group's barrier and reductions (no-ops without ``state``, the
    accelerate ``PartialState`` of a ranked local run). ``alone``: the process shares no group (a task), so it is
    its own main process whatever its rank."""

    rank: int = 0
    world: int = 1
    device: str | None = None
    state: Any = None
    alone: bool = False

    @property
    def is_main(self) -> bool:
        return self.alone or self.rank == 0

    def barrier(self) -> None:
        if self.state is not None and self.world > 1:
            self.state.wait_for_everyone()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank of the group (``obj`` itself alone)."""
        if self.state is None or self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def reduce(self, value: float, op: str = "sum") -> float:
        """Sum or max of ``value`` over the group."""
        if self.state is None or self.world == 1:
            return value
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64,
                         device=self.state.device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return float(t.item())

    # the accelerate-state surface older code reads (``is_main_process``, ``wait_for_everyone``)
    @property
    def is_main_process(self) -> bool:
        return self.is_main

    @property
    def num_processes(self) -> int:
        return self.world

    @property
    def process_index(self) -> int:
        return self.rank

    def wait_for_everyone(self) -> None:
        self.barrier()


class Maker(ABC):
    """What makes a job's parts in one process: built once per process (it loads the model, places it on the
    device) and closed at the end. ``threads``: what it set torch's intra-op threads to (recorded by score)."""

    threads: dict = {}

    @abstractmethod
    def make(self, parts: Sequence[Any], bar: Any, written: Callable[[str, dict], None]) -> None:
        """Make ``parts`` (each written atomically with its record, :func:`~halsift.execution.run_folder.part_done`),
        calling ``written(name, stats)`` as each one is; ``bar``: a progress bar or ``None``."""

    def close(self) -> None:
        """Release what :meth:`make` held (threads, worker processes)."""


@dataclass
class Outcome:
    """What an engine did for a job, handed to :attr:`Work.finish` on the process that completes the folder."""

    engine: str
    made: int  # parts made by this run (every rank or task of it)
    reused: int  # parts found done when it started
    items: int  # items made by this run (:attr:`Work.count` of each part made)
    wall_s: float
    making_s: float  # the making loop's time (model loading excluded)
    world: int  # ranks, tasks or Ray actors
    threads: dict = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)  # every task run's record (tasks engine)
    extra: dict = field(default_factory=dict)  # the engine's own counts (e.g. Ray's parts_redone)


@dataclass
class Work:
    """An opened job: its folder, its parts (anything with a ``name``: the part's file in the folder), whether a part
    is done (``done``: its record holds), what makes parts (``maker()``, called at most once per process, lazily:
    a process that finds every part done loads no model) and ``finish(outcome)``, which writes the complete record
    and returns it. ``window``: parts made at a time by one maker (its decode workers); ``count(stats)``: items in a
    written part's stats; ``actor``: a picklable factory of the maker for a Ray actor (default: none, the job runs on
    Ray as one Ray task per part with ``maker``), and its resources."""

    folder: RunFolder
    parts: Sequence[Any]
    done: Callable[[Any], bool]
    maker: Callable[[], Maker]
    finish: Callable[[Outcome], dict]
    window: int = 1
    unit: str = "part"
    verb: str = "made"  # what making a part is called in the engine's lines ("scored", "embedded")
    count: Callable[[dict], int] = lambda stats: 0
    actor: Callable[[], Maker] | None = None
    actor_gpu: bool = False  # a Ray actor of this job takes a GPU when the cluster has them
    actor_cpus: int = 1  # its CPUs (beside a GPU: ``actor_cpus - 1``)


class Job(ABC):
    """A per-part job (subclasses are dataclasses whose fields include the :data:`ENGINE_FLAGS` they take).
    ``kind``: its name in messages; ``honours``: the engine flags it honours (any other it gives is refused in one
    line, with ``why_not[flag]`` as the reason); ``ranked``: the local engine splits its parts over a launch's ranks
    (else one process makes them all)."""

    kind: ClassVar[str] = "job"
    honours: ClassVar[frozenset[str]] = frozenset(ENGINE_FLAGS)
    why_not: ClassVar[Mapping[str, str]] = {}
    ranked: ClassVar[bool] = False

    def flag(self, name: str) -> Any:
        """An engine flag's value (``None``, or 0 for ``decode_workers``, when the job has no such field)."""
        return getattr(self, name, 0 if name == "decode_workers" else None)

    def given_flags(self) -> set[str]:
        """The engine flags this job sets away from their defaults."""
        return {f for f in ENGINE_FLAGS if self.flag(f) not in (None, 0)}

    @property
    def show_progress(self) -> bool:  # overridden by a dataclass field of that name
        return True

    def refuses(self, engine: str) -> Mapping[str, str]:
        """Flags this job cannot honour on ``engine`` alone (flag -> reason), beyond :attr:`why_not`."""
        return {}

    def check(self) -> None:
        """The job's own checks of its settings, before any work (one line naming the setting)."""

    def staged(self) -> "Job":
        """The job as the engine runs it: itself, or the :class:`Pipeline` it expands to."""
        return self

    @abstractmethod
    def open(self, place: Place) -> Work:
        """Check or start the folder's identity (every process; the main one writes the ``running`` record) and plan
        the parts."""


class Pipeline(Job):
    """A job made of jobs: :meth:`run_on` runs each step as an ordinary job on the engine given (so it splits into
    ranks, tasks or Ray actors like any job, and resumes step by step)."""

    def open(self, place: Place) -> Work:  # pragma: no cover - a pipeline is never opened as one job
        raise TypeError(f"{self.kind}: a pipeline runs through run_on, not open")

    @abstractmethod
    def run_on(self, engine: Any) -> Any:
        """Run every step on ``engine`` (an :class:`~halsift.execution.engines.Engine`); returns the
        :class:`~halsift.execution.engines.Summary` of the whole."""


def given(job: Any) -> set[str]:
    """The fields of a job dataclass set away from their defaults."""
    return {f.name for f in dataclasses.fields(job) if getattr(job, f.name) != f.default}


__all__ = ["ENGINE_FLAGS", "Job", "Maker", "Outcome", "Pipeline", "Place", "Work", "given"]
