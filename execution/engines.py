"""The engines: where a job's parts are made. One loop each, for every job (:class:`~halsift.execution.job.Job`):

* ``local`` (:class:`LocalEngine`): this process, or every rank of a ``halsift launch``/``torchrun`` group (parts
  dealt round-robin to the ranks, for a job whose ``ranked`` says so);
* ``tasks`` (:class:`TaskEngine`): independent processes (SLURM array tasks, ``--num-tasks``) sharing the folder
  through claims (:mod:`.claims`), no process group; with ``wait`` a task that finds the rest held waits for it (its
  model stays loaded) and takes over a dead task's parts;
* ``ray`` (:class:`RayEngine`): actors on a Ray cluster, each building the job's maker once, parts dealt as actors
  free up, a dead actor replaced and its parts dealt again.

Each engine honours some engine flags and refuses, in one line naming the flag, any other a job gives (and a job
refuses the flags it cannot honour): no flag is silently ignored. A new engine is one class and one
:func:`register_engine` call. :func:`run_job` is the one door: a job (or the pipeline it expands to) on the engine a
name resolves to. Light to import (no torch).
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from halsift.corpus.errors import InputError
from halsift.execution.job import Job, Maker, Outcome, Pipeline, Place, Work


class EngineError(InputError):
    """A job an engine cannot run as asked (a flag it does not honour, a bad count): one line naming the flag."""


@dataclass
class Summary:
    """What an engine reports of one job: ``complete`` (the folder's record says complete), ``report`` (this process
    reports the result: rank 0 of a group), ``lines`` (the engine's own one-line notes, in order) and ``stats`` (the
    folder's complete record, or this task's run record while it is not complete) and ``run`` (what this process
    did: parts made and their names, parts found done, items)."""

    engine: str
    out: Path
    complete: bool
    report: bool = True
    lines: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    run: dict = field(default_factory=dict)


_RAY_ONLY = "--address/--workers: only with --engine ray"
POLL_S = float(os.environ.get("HALSIFT_TASK_POLL_S", "10"))  # a waiting task looks again after this many seconds


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


class Engine(ABC):
    """One way to make a job's parts. Subclasses set ``name`` and ``flags`` (the engine flags they honour) and
    implement :meth:`run`."""

    name: ClassVar[str]
    flags: ClassVar[frozenset[str]] = frozenset({"decode_workers"})

    def refusal(self, flag: str) -> str:
        """The one line refusing ``flag`` (overridden to say where the flag belongs)."""
        return f"{_flag(flag)}: not honoured by --engine {self.name}"

    def check(self, job: Job) -> None:
        """Refuse, before any work, a flag the job cannot honour or this engine does not, and bad counts."""
        for flag in sorted(job.given_flags()):
            why = job.refuses(self.name).get(flag)
            if why is not None or flag not in job.honours:
                raise EngineError(f"{_flag(flag)}: halsift {job.kind} {why or job.why_not.get(flag, 'does not honour it')}")
            if flag not in self.flags:
                raise EngineError(self.refusal(flag))
        if job.flag("decode_workers") < 0:
            raise EngineError(f"--decode-workers: expected >= 0, got {job.flag('decode_workers')}")
        workers = job.flag("workers")
        if workers is not None and workers < 1:
            raise EngineError(f"--workers: expected >= 1, got {workers}")

    def execute(self, job: Job, wait: bool = False) -> Summary:
        """Check ``job`` and run it (a :class:`~halsift.execution.job.Pipeline` runs its steps here). ``wait``: return
        only once the folder is complete (a pipeline's step that the next step reads)."""
        job.check()
        job = job.staged()
        if isinstance(job, Pipeline):
            return job.run_on(self)
        self.check(job)
        return self.run(job, wait=wait)

    @abstractmethod
    def run(self, job: Job, wait: bool = False) -> Summary:
        """Make the job's parts that are not done, then (where this process completes the folder) finish it.
        ``wait``: also wait for the parts other processes hold (the tasks engine; the others make every part)."""


def _bar(job: Job, work: Work, desc: str):
    from halsift.corpus.progress import progress

    return progress(desc=desc, unit=work.unit, disable=not job.show_progress)


class _Tally:
    """Parts made (and their names) and items, counted as each part is written (and shown on ``bar``, once there is
    one)."""

    def __init__(self, work: Work) -> None:
        self.work, self.made, self.items, self.bar, self.names = work, 0, 0, None, []

    def __call__(self, name: str, stats: dict) -> None:
        self.made += 1
        self.names.append(name)
        self.items += int(self.work.count(stats))
        if self.bar is not None:
            self.bar.set_postfix(**{f"parts_{self.work.verb}": self.made, "parts": len(self.work.parts)})


def _same(kind: type, message: str) -> Exception:
    """The main process's error, raised again on another rank (its type when it takes a message, else a
    RuntimeError with the same line)."""
    try:
        return kind(message)
    except Exception:  # noqa: BLE001 - an exception type whose constructor wants more than a message
        return RuntimeError(message)


# ------------------------------------------------------------------------------------------------ local
class LocalEngine(Engine):
    """This process, or every rank of a launch (a ``ranked`` job's parts round-robin over the ranks)."""

    name = "local"

    def refusal(self, flag: str) -> str:
        if flag in ("address", "workers"):
            return _RAY_ONLY
        if flag == "claim_timeout":
            return "--claim-timeout: only with --num-tasks (or in a SLURM array task)"
        return super().refusal(flag)

    def run(self, job: Job, wait: bool = False) -> Summary:
        t0 = time.perf_counter()
        if job.ranked:
            from halsift.execution.ranks import rank_place

            place = rank_place(getattr(job, "device", None))
        else:
            place = Place(device=getattr(job, "device", None))
        work = job.open(place)
        with work.folder.failing():
            mine = list(work.parts)[place.rank::place.world]
            todo = [p for p in mine if not work.done(p)]
            reused = int(place.reduce(len(mine) - len(todo)))
            tally, making, threads = _Tally(work), 0.0, {}
            if todo:
                maker = work.maker()
                try:
                    bar = tally.bar = _bar(job, work, f"{job.kind} rank {place.rank}" if job.ranked
                                           else f"{job.kind}: parts")
                    ts = time.perf_counter()
                    maker.make(todo, bar, tally)
                    making = time.perf_counter() - ts
                    bar.close()
                    threads = maker.threads
                finally:
                    maker.close()
            made, items = int(place.reduce(tally.made)), int(place.reduce(tally.items))
            making = place.reduce(making, "max")
            place.barrier()
            failed, record = None, {}
            if place.is_main:
                try:
                    missing = [p.name for p in work.parts if not work.done(p)]
                    if missing:
                        raise RuntimeError(f"{work.folder.path}: parts {missing[:5]} were not written; rerun the same "
                                           "command to finish")
                    record = work.finish(Outcome(self.name, made, reused, items, time.perf_counter() - t0, making,
                                                 place.world, threads))
                except Exception as e:  # raised after the barrier, so the other ranks are not left waiting
                    failed = e
            # every rank stops with the main process's line (none exits 0 beside a failed folder)
            why = place.broadcast(None if failed is None else (type(failed), str(failed)))
            if failed is not None:
                raise failed
            if why is not None:
                raise _same(*why)
        return Summary(self.name, work.folder.path, True, place.is_main, [], record,
                       {"parts_made": made, "parts_skipped_done": reused, "items": items, "made": tally.names})


# ------------------------------------------------------------------------------------------------ tasks
class TaskEngine(Engine):
    """One independent task of ``num_tasks`` (its index from the job or from a SLURM array task's environment)."""

    name = "tasks"
    flags = frozenset({"decode_workers", "num_tasks", "task_index", "claim_timeout"})

    def refusal(self, flag: str) -> str:
        return _RAY_ONLY if flag in ("address", "workers") else super().refusal(flag)

    def task(self, job: Job) -> tuple[int, int]:
        from halsift.execution.claims import TaskError, task_from_env

        task = task_from_env(job.flag("num_tasks"), job.flag("task_index"))
        if task is None:
            raise EngineError("--engine tasks: give --num-tasks (or run it as a SLURM array task)")
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            raise TaskError("--num-tasks: each task is one process; do not run it under torchrun/accelerate launch")
        return task

    def check(self, job: Job) -> None:
        super().check(job)
        self.task(job)

    def run(self, job: Job, wait: bool = False, steal: bool = True) -> Summary:
        """Task ``i`` of ``n``: claim parts (its own share first, then, with ``steal``, any no one holds), make them;
        ``wait``: then wait for the parts running tasks hold (its maker kept: no model is loaded twice), taking over
        a dead task's. The task that finds every part done finishes the folder."""
        import json

        from halsift.corpus.shards import write_json_atomic
        from halsift.execution.claims import HOST, STALE_AFTER_S, TASKS, task_order

        n, i = self.task(job)
        stale = job.flag("claim_timeout") or STALE_AFTER_S
        t0 = time.perf_counter()
        work = job.open(Place(i, n, getattr(job, "device", None), alone=True))
        name = f"task-{i:05d}"
        with work.folder.failing():
            board = work.folder.claims(f"{name}@{HOST}:{os.getpid()}", stale)
            tally = _Tally(work)
            run = {"task_index": i, "num_tasks": n, "host": HOST, "pid": os.getpid(), "start": time.time(),
                   "parts_made": 0, "parts_skipped_done": 0, "parts_held_elsewhere": 0, "items": 0}
            counts = {"done": "parts_skipped_done", "held": "parts_held_elsewhere"}
            first = [True]

            def seen(kind: str) -> None:
                if first[0]:
                    run[counts[kind]] += 1

            maker: Maker | None = None
            bar, making, threads = None, 0.0, {}
            reused = sum(1 for p in work.parts if work.done(p))
            try:
                while True:
                    order = task_order(list(work.parts), n, i, steal)
                    with closing(board.windows(order, work.window, work.done, seen)) as windows:
                        for claimed in windows:
                            if maker is None:
                                maker = work.maker()
                                bar = tally.bar = _bar(job, work, f"{job.kind} task {i}/{n}")
                            ts = time.perf_counter()

                            def written(part: str, stats: dict) -> None:
                                board.finish(part, claimed.pop(part)[1])
                                tally(part, stats)

                            maker.make([p for p, _ in claimed.values()], bar, written)
                            making += time.perf_counter() - ts
                    first[0] = False
                    missing = [p.name for p in work.parts if not work.done(p)]
                    if not missing or not wait:
                        break
                    time.sleep(POLL_S)  # the rest is held by running tasks: wait, the maker loaded
                if maker is not None:
                    threads = maker.threads
            finally:
                if bar is not None:
                    bar.close()
                if maker is not None:
                    maker.close()
            run.update(end=time.time(), parts_made=tally.made, items=tally.items, made=tally.names,
                       parts_taken_over=board.taken_over, making_time_s=round(making, 3), threads=threads)
            (work.folder.path / TASKS).mkdir(exist_ok=True)
            write_json_atomic(work.folder.path / TASKS / f"{name}.{HOST}.{os.getpid()}.json", run)
            run["complete"] = not missing
            run["parts_missing"] = len(missing)
            run["held_by_live_tasks"] = board.held(missing)
            lines = [f"task {i}/{n}: {work.verb} {tally.made} parts ({tally.items} items), {run['parts_skipped_done']} "
                     f"already done, {board.taken_over} taken over from dead tasks"]
            if missing:
                lines.append(f"task {i}/{n}: {len(missing)} parts not written yet ({len(run['held_by_live_tasks'])} "
                             "held by running tasks); the last task to finish completes "
                             f"{work.folder.path / work.folder.manifest}")
                return Summary(self.name, work.folder.path, False, True, lines, run, run)
            # tasks that end together may each finish the folder; each finishes again while the task records
            # change under it, so the last record written counts every task (no lock: SLURM's shared filesystems)
            seen_runs: list[str] = []
            while (names := sorted(p.name for p in (work.folder.path / TASKS).glob("task-*.json"))) != seen_runs:
                seen_runs = names
                runs = [json.loads((work.folder.path / TASKS / r).read_text()) for r in names]
                span = (max(r["end"] for r in runs) - min(r["start"] for r in runs)) if runs else making
                record = work.finish(Outcome(self.name, sum(r.get("parts_made", 0) for r in runs), reused,
                                             sum(r.get("items", 0) for r in runs), time.perf_counter() - t0, span,
                                             n, threads, runs))
        return Summary(self.name, work.folder.path, True, True, lines, record, run)


# ------------------------------------------------------------------------------------------------ ray
def ray_module():
    """Ray, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        from halsift.execution.claims import TaskError

        raise TaskError("--engine ray: Ray is not installed; pip install 'halsift[ray]'") from None
    return ray


class _Actor:
    """A Ray actor's body: one maker, built once, making whole parts."""

    def __init__(self, factory, index: int, world: int) -> None:
        self.maker = factory(index, world)

    def pid(self) -> int:
        return os.getpid()

    def make(self, parts: list) -> dict:
        stats: dict[str, dict] = {}
        self.maker.make(parts, None, lambda name, s: stats.__setitem__(name, s))
        return {"parts": stats, "threads": self.maker.threads}


class RayEngine(Engine):
    """Actors on a Ray cluster (``halsift[ray]``): one per GPU of the cluster (a job that takes one), else per CPU,
    or ``--workers``; each builds the job's maker once and is dealt the next parts as it frees up."""

    name = "ray"
    flags = frozenset({"decode_workers", "address", "workers"})
    max_failures = 3  # a part whose actor died this many times stops the run

    def refusal(self, flag: str) -> str:
        if flag in ("num_tasks", "task_index", "claim_timeout"):
            return "--engine ray: Ray deals the parts itself; drop --num-tasks/--task-index/--claim-timeout"
        return super().refusal(flag)

    def check(self, job: Job) -> None:
        super().check(job)
        ray_module()  # not installed: one line, before any work

    def run(self, job: Job, wait: bool = False, on_start=None) -> Summary:
        """``on_start(actors)`` is called once the actors exist (tests use it to kill one)."""
        ray = ray_module()
        t0 = time.perf_counter()
        device = getattr(job, "device", None)
        work = job.open(Place(device=device))
        with work.folder.failing():
            todo = [p for p in work.parts if not work.done(p)]
            reused = len(work.parts) - len(todo)
            if not ray.is_initialized():
                ray.init(address=job.flag("address"), log_to_driver=False)
            gpus = int(ray.cluster_resources().get("GPU", 0)) if device != "cpu" and work.actor_gpu else 0
            n = job.flag("workers") or gpus or int(ray.cluster_resources().get("CPU", 1))
            n = max(1, min(n, len(todo))) if todo else 0
            cpus = max(0, work.actor_cpus - 1) if gpus else work.actor_cpus
            Actor = ray.remote(num_gpus=1 if gpus else 0, num_cpus=cpus)(_Actor)
            factory = work.actor
            if factory is None:
                raise EngineError(f"--engine ray: halsift {job.kind} does not run on Ray")
            actors = {k: Actor.remote(factory, k, n) for k in range(n)}
            if on_start is not None:
                on_start(actors)
            queue, running, failures, redone = list(todo), {}, {}, 0
            tally, threads, ts = _Tally(work), {}, time.perf_counter()

            def give(k: int) -> None:
                if queue:
                    chunk, queue[:work.window] = queue[:work.window], []
                    running[actors[k].make.remote(chunk)] = (k, chunk)

            bar = _bar(job, work, f"{job.kind} ray ({n} workers)")
            for k in actors:
                give(k)
            while running:
                finished, _ = ray.wait(list(running), num_returns=1)
                k, chunk = running.pop(finished[0])
                try:
                    result = ray.get(finished[0])
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                    lost = [p for p in chunk if not work.done(p)]  # parts it wrote before dying stay
                    for part in lost:
                        failures[part.name] = failures.get(part.name, 0) + 1
                        if failures[part.name] > self.max_failures:
                            raise RuntimeError(f"part {part.name}: its worker died {failures[part.name]} times ({e}); "
                                               "rerun the same command to finish the other parts") from e
                    redone += len(lost)
                    queue[:0] = lost
                    actors[k] = Actor.remote(factory, k, n)  # a replacement for the dead actor
                except ray.exceptions.RayTaskError as e:
                    if isinstance(e.cause, InputError):  # a guard or a rule stopped the run: its one line
                        raise type(e.cause)(str(e.cause)) from None
                    raise
                else:
                    for name, s in result["parts"].items():
                        tally(name, s)
                    threads = result["threads"]
                    bar.update(len(chunk))
                give(k)
            bar.close()
            missing = [p.name for p in work.parts if not work.done(p)]
            if missing:
                raise RuntimeError(f"{work.folder.path}: parts {missing[:5]} were not written; rerun the same command "
                                   "to finish")
            record = work.finish(Outcome(self.name, tally.made, reused, tally.items, time.perf_counter() - t0,
                                         time.perf_counter() - ts, n, threads, extra={"workers": n,
                                                                                      "parts_redone": redone}))
        return Summary(self.name, work.folder.path, True, True,
                       [f"ray: {n} workers, {redone} parts redone after a worker died"], record,
                       {"parts_made": tally.made, "parts_skipped_done": reused, "items": tally.items,
                        "parts_redone": redone, "made": tally.names})


# ------------------------------------------------------------------------------------------------ registry
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


def resolve_engine(name: str, job: Any = None, env: dict | None = None) -> Engine:
    """The engine ``--engine NAME`` runs ``job`` on: ``local`` becomes ``tasks`` when the job names a task
    (``num_tasks``/``task_index``) or the process is a SLURM array task (the README's scale-out path)."""
    if name == "local" and job is not None:
        from halsift.execution.claims import task_from_env

        num, index = getattr(job, "num_tasks", None), getattr(job, "task_index", None)
        if task_from_env(num, index, env) is not None:
            return ENGINES["tasks"]
    return get_engine(name)


def run_job(job: Job, engine: str = "local") -> Summary:
    """The one door: ``job`` (or the pipeline it expands to) on the engine ``engine`` resolves to."""
    return resolve_engine(engine, job).execute(job)


__all__ = ["ENGINES", "Engine", "EngineError", "LocalEngine", "RayEngine", "Summary", "TaskEngine", "get_engine",
           "ray_module", "register_engine", "resolve_engine", "run_job"]
