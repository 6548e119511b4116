"""The scoring ``Engine`` interface: one typed :class:`ScoreJob` in, one :class:`EngineSummary` out.

An engine decides *where* the parts of a score folder (:mod:`.parts`) are scored; every engine writes the same parts
and manifest, so ``select`` reads a folder whatever wrote it, and any engine resumes any other's folder:

* ``local`` (:mod:`.runner`): this process, or every rank of a ``halsift launch``/``torchrun`` group, parts dealt
  round-robin to the ranks;
* ``tasks`` (:mod:`.tasks`): independent processes (SLURM array tasks, ``--num-tasks``) sharing the folder through
  claims, no process group;
* ``ray`` (:mod:`.ray_engine`): actors on a Ray cluster, parts dealt as actors free up.

Each engine declares the job settings it honours (:attr:`Engine.honours`) and refuses, in one line naming the flag,
a setting it does not (:meth:`Engine.check`): no flag is silently ignored. The input pipeline is part of every
engine: ``decode_workers`` > 0 runs reading, decoding and the detector's ``prepare`` in that many processes per
scoring process (:mod:`.workers`). The registry (:data:`ENGINES`, :func:`get_engine`) is what ``halsift score
--engine`` resolves; library code builds a :class:`ScoreJob` and never sees argv. Light to import (no torch).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from halsift.corpus.errors import InputError
from halsift.filtering.scoring.job import ScoreJob, given  # the job (re-exported)

if TYPE_CHECKING:
    from halsift.filtering.scoring.embed import EmbedJob
    from halsift.filtering.scoring.stage import StageJob

EngineName = Literal["local", "tasks", "ray"]  # the registry's names (a test keeps them in step with ENGINES)


class EngineError(InputError):
    """A job an engine cannot run as asked (a setting it does not honour, a missing one): one line naming the flag."""


@dataclass
class EngineSummary:
    """What an engine reports of one run: ``complete`` (the folder's manifest says complete), ``report`` (this
    process reports the result: rank 0 of a group), ``lines`` (the engine's own one-line notes, in order) and its
    run ``stats`` (the manifest, or a task's run)."""

    engine: str
    out: Path
    complete: bool
    report: bool = True
    lines: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


COMMON = frozenset({"detector", "data", "out", "unit", "batch_size", "device", "decode_workers",
                    "max_parse_failures", "show_progress", "embeddings", "full_hash"})  # honoured by every engine
# halsift embed's job, on any engine (decode_workers: local and tasks; Ray runs --workers parts at a time)
EMBED = frozenset({"model", "data", "out", "batch_size", "device", "show_progress"})


class Engine(ABC):
    """One way to score a job's parts. Subclasses set ``name`` and ``honours`` and implement :meth:`run`."""

    name: ClassVar[str]
    honours: ClassVar[frozenset[str]] = COMMON

    def refusal(self, setting: str) -> str:
        """The one line refusing ``setting`` (overridden to say where the setting belongs)."""
        return f"--{setting.replace('_', '-')}: not honoured by --engine {self.name}"

    def check(self, job: Any, honours: frozenset[str] | None = None) -> None:
        """Raise :class:`EngineError` for the first setting ``job`` gives that this engine does not honour."""
        honours = self.honours if honours is None else honours
        for name in (f.name for f in dataclasses.fields(job)):
            if name in given(job) and name not in honours:
                raise EngineError(self.refusal(name))

    @abstractmethod
    def run(self, job: ScoreJob) -> EngineSummary:
        """Score ``job`` (after :meth:`check`); raises ``ScoreError``/``RunMismatch``/``DetectorError`` as the
        part store and the detectors do."""

    def embed(self, job: "EmbedJob") -> EngineSummary:
        """``halsift embed``'s job (:mod:`.embed`): the same parts, split the way this engine splits score's."""
        raise EngineError(f"--engine {self.name}: halsift embed runs on --engine local, tasks or ray")

    def stage(self, job: "StageJob") -> EngineSummary:
        """A per-shard corpus stage (``basic``, dedup's hashes, :mod:`.stage`): its parts, split the way this engine
        splits score's. ``complete``: every part is written."""
        self.check_stage(job)
        run = self._stage(job)
        return EngineSummary(self.name, Path(job.out), run.complete, True, run.lines,
                             {"parts": len(job.parts), "made": run.made, "reused": run.reused,
                              "missing": len(run.missing)})

    def check_stage(self, job: "StageJob") -> None:
        """Refuse, in one line naming the flag, a stage job this engine cannot run (before any work)."""
        from halsift.filtering.scoring.stage import check_stage

        check_stage(job)
        for name in sorted(job.given()):
            if name not in self.honours:
                raise EngineError(self.refusal(name))

    def _stage(self, job: "StageJob"):
        from halsift.filtering.scoring.stage import run_local

        return run_local(job)


_RAY_ONLY = "--address/--workers: only with --engine ray"


class LocalEngine(Engine):
    """The rank-split run (:func:`.runner.score_job`): one process, or every rank of a launch."""

    name = "local"

    def refusal(self, setting: str) -> str:
        if setting in ("address", "workers"):
            return _RAY_ONLY
        if setting == "claim_timeout":
            return "--claim-timeout: only with --num-tasks (or in a SLURM array task)"
        return super().refusal(setting)

    def run(self, job: ScoreJob) -> EngineSummary:
        self.check(job)
        from accelerate import PartialState

        from halsift.filtering.scoring.runner import score_job

        out = score_job(job)
        return EngineSummary(self.name, Path(out), True, PartialState().is_main_process)

    def embed(self, job: "EmbedJob") -> EngineSummary:
        self.check(job, EMBED | {"decode_workers"})
        from halsift.filtering.scoring.embed import embed_local

        m = embed_local(job)
        return EngineSummary(self.name, Path(job.out), bool(m.get("complete")), bool(m), [], m)


class TaskEngine(Engine):
    """One independent task of ``num_tasks`` (:func:`.tasks.score_task`); the index from the job or from a SLURM
    array task's environment."""

    name = "tasks"
    honours = COMMON | {"num_tasks", "task_index", "claim_timeout"}

    def refusal(self, setting: str) -> str:
        return _RAY_ONLY if setting in ("address", "workers") else super().refusal(setting)

    def run(self, job: ScoreJob) -> EngineSummary:
        self.check(job)
        from halsift.filtering.scoring.tasks import STALE_AFTER_S, score_task, task_from_env

        task = task_from_env(job.num_tasks, job.task_index)
        if task is None:
            raise EngineError("--engine tasks: give --num-tasks (or run it as a SLURM array task)")
        n, i = task
        stale = STALE_AFTER_S if job.claim_timeout is None else job.claim_timeout
        run = score_task(job, n, i, stale_after=stale)
        lines = [f"task {i}/{n}: scored {run['parts_scored']} parts ({run['sentences']} items), "
                 f"{run['parts_skipped_done']} already done, {run['parts_taken_over']} taken over from dead tasks"]
        if not run["complete"]:
            lines.append(f"task {i}/{n}: {run['parts_missing']} parts not written yet "
                         f"({len(run['held_by_live_tasks'])} held by running tasks); the last task to finish "
                         f"completes {Path(job.out) / '_manifest.json'}")
        return EngineSummary(self.name, Path(job.out), run["complete"], True, lines, run)

    def embed(self, job: "EmbedJob") -> EngineSummary:
        self.check(job, EMBED | {"decode_workers", "num_tasks", "task_index", "claim_timeout"})
        from halsift.filtering.scoring.embed import embed_task
        from halsift.filtering.scoring.tasks import STALE_AFTER_S, task_from_env

        task = task_from_env(job.num_tasks, job.task_index)
        if task is None:
            raise EngineError("--engine tasks: give --num-tasks (or run it as a SLURM array task)")
        n, i = task
        m = embed_task(job, n, i, STALE_AFTER_S if job.claim_timeout is None else job.claim_timeout)
        lines = [] if m["complete"] else [f"task {i}/{n}: {m['parts'] - m['parts_written']} parts not written yet; "
                                          f"the last task to finish completes {Path(job.out) / '_manifest.json'}"]
        return EngineSummary(self.name, Path(job.out), bool(m["complete"]), True, lines, m)

    def check_stage(self, job: "StageJob") -> None:
        super().check_stage(job)
        from halsift.filtering.scoring.tasks import task_from_env

        if task_from_env(job.num_tasks, job.task_index) is None:
            raise EngineError("--engine tasks: give --num-tasks (or run it as a SLURM array task)")

    def _stage(self, job: "StageJob"):
        from halsift.filtering.scoring.stage import run_task
        from halsift.filtering.scoring.tasks import STALE_AFTER_S, task_from_env

        task = task_from_env(job.num_tasks, job.task_index)
        return run_task(job, *task, STALE_AFTER_S if job.claim_timeout is None else job.claim_timeout)


class RayEngine(Engine):
    """Actors on a Ray cluster (:func:`.ray_engine.score_ray`)."""

    name = "ray"
    honours = COMMON | {"address", "workers"}

    def refusal(self, setting: str) -> str:
        if setting in ("num_tasks", "task_index", "claim_timeout"):
            return "--engine ray: Ray deals the parts itself; drop --num-tasks/--task-index/--claim-timeout"
        if setting == "decode_workers":
            return "--decode-workers: halsift embed on --engine ray makes --workers parts at a time; drop it"
        return super().refusal(setting)

    def run(self, job: ScoreJob) -> EngineSummary:
        self.check(job)
        if job.workers is not None and job.workers < 1:
            raise EngineError(f"--workers: expected >= 1, got {job.workers}")
        from halsift.filtering.scoring.ray_engine import score_ray

        m = score_ray(job)
        return EngineSummary(self.name, Path(job.out), True, True,
                             [f"ray: {m['workers']} workers, {m['parts_redone']} parts redone after a worker died"], m)

    def check_stage(self, job: "StageJob") -> None:
        super().check_stage(job)
        if job.workers is not None and job.workers < 1:
            raise EngineError(f"--workers: expected >= 1, got {job.workers}")
        from halsift.filtering.scoring.ray_engine import _ray

        _ray()  # Ray not installed: one line, before any work

    def _stage(self, job: "StageJob"):
        from halsift.filtering.scoring.stage import run_ray

        return run_ray(job)

    def embed(self, job: "EmbedJob") -> EngineSummary:
        self.check(job, EMBED | {"address", "workers"})
        if job.workers is not None and job.workers < 1:
            raise EngineError(f"--workers: expected >= 1, got {job.workers}")
        from halsift.filtering.scoring.embed import embed_ray

        m = embed_ray(job)
        return EngineSummary(self.name, Path(job.out), bool(m.get("complete")), True, [], m)


ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    """Add ``engine`` to the registry under its name (a new engine: one module and this call)."""
    ENGINES[engine.name] = engine
    return engine


for _e in (LocalEngine(), TaskEngine(), RayEngine()):
    register_engine(_e)


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise EngineError(f"--engine: expected one of {', '.join(ENGINES)}, got {name!r}") from None


def resolve_engine(name: str, job: Any, env: dict | None = None) -> Engine:
    """The engine ``halsift score --engine NAME`` runs ``job`` on: ``local`` becomes ``tasks`` when the job names a
    task (``num_tasks``/``task_index``) or the process is a SLURM array task (the README's scale-out path)."""
    if name == "local":
        from halsift.filtering.scoring.tasks import task_from_env

        if task_from_env(job.num_tasks, job.task_index, env) is not None:
            return ENGINES["tasks"]
    return get_engine(name)


def run_job(job: Any, engine: str = "local") -> EngineSummary:
    """Resolve ``engine`` for ``job`` (a :class:`ScoreJob`, an ``EmbedJob`` or a ``StageJob``) and run it."""
    from halsift.filtering.scoring.stage import StageJob

    e = resolve_engine(engine, job)
    if isinstance(job, StageJob):
        return e.stage(job)
    return e.run(job) if isinstance(job, ScoreJob) else e.embed(job)


__all__ = ["ENGINES", "Engine", "EngineError", "EngineName", "EngineSummary", "LocalEngine", "RayEngine",
           "ScoreJob", "TaskEngine", "get_engine", "register_engine", "resolve_engine", "run_job"]
