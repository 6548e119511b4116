"""Per-shard corpus stages (``basic``, dedup's hashes and embeddings) on the scoring engines (:mod:`.engine`).

A :class:`StageJob` is a list of named parts, a picklable ``make(part)`` that writes one part into the stage's
folder (atomically, with its :mod:`halsift.corpus.run_folder` record) and a ``done(part)`` that says whether a part
may be reused (the run-folder rule: its input's content fingerprint and the settings it was made from). The engines
only decide *where* parts are made, as they do for score parts:

* ``local``: this process; ``decode_workers`` > 0 makes that many parts at a time in as many processes;
* ``tasks``: task ``i`` of ``n`` claims parts (:class:`.tasks.ClaimBoard`, work stealing, a dead task's claim taken
  over), ``decode_workers`` parts at a time;
* ``ray``: one Ray task per part (Ray an optional extra, refused in one line when absent).

A stage that cannot honour a flag lists it out of :attr:`StageJob.honours`; the engine refuses it in one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from halsift.corpus.config import field as cfield
from halsift.corpus.errors import InputError

class StageError(InputError):
    """A flag a per-shard stage cannot honour, or a bad value (one line naming the flag)."""


FLAGS = ("decode_workers", "num_tasks", "task_index", "claim_timeout", "address", "workers")


@dataclass(frozen=True)
class StagePart:
    """One part of a stage: its file name in the stage's folder and what ``make`` needs to write it."""

    name: str
    args: tuple = ()


@dataclass(frozen=True)
class StageJob:
    """A per-shard stage run on an engine. ``make``/``done`` must pickle (module-level functions or partials of
    them) when ``decode_workers`` > 0 or on Ray. ``honours``: the flags of :data:`FLAGS` the stage honours;
    ``why_not``: the reason a flag it does not honour is refused (by flag name)."""

    stage: str
    out: Path
    parts: Sequence[StagePart]
    make: Callable[[StagePart], Any]
    done: Callable[[StagePart], bool]
    honours: frozenset = frozenset(FLAGS)
    why_not: dict = field(default_factory=dict)
    show_progress: bool = True
    decode_workers: int = 0
    num_tasks: int | None = None
    task_index: int | None = None
    claim_timeout: float | None = None
    address: str | None = None
    workers: int | None = None

    def given(self) -> set[str]:
        """The engine flags set away from their defaults."""
        defaults = {"decode_workers": 0}
        return {f for f in FLAGS if getattr(self, f) != defaults.get(f)}


@dataclass
class StageRun:
    """What a stage run did: parts made here, parts found done, parts still missing (held by other tasks)."""

    made: int = 0
    reused: int = 0
    missing: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing


def check_stage(job: StageJob) -> None:
    """The stage's own refusals: a flag it does not honour, one line naming it; a bad count."""
    for flag in FLAGS:
        if flag in job.given() and flag not in job.honours:
            why = job.why_not.get(flag, "not honoured")
            raise StageError(f"--{flag.replace('_', '-')}: halsift {job.stage} {why}")
    if job.decode_workers < 0:
        raise StageError(f"--decode-workers: expected >= 0, got {job.decode_workers}")


def _pool(n: int):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"))


def _make_all(job: StageJob, parts: list[StagePart], bar, on_made: Callable[[StagePart], None] | None = None) -> int:
    """Make ``parts`` here, or ``decode_workers`` at a time in as many processes."""
    if job.decode_workers > 0 and len(parts) > 1:
        from concurrent.futures import FIRST_COMPLETED, wait

        with _pool(min(job.decode_workers, len(parts))) as pool:
            pending = {pool.submit(job.make, p): p for p in parts}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    p = pending.pop(f)
                    f.result()
                    if on_made is not None:
                        on_made(p)
                    bar.update()
        return len(parts)
    for p in parts:
        job.make(p)
        if on_made is not None:
            on_made(p)
        bar.update()
    return len(parts)


def run_local(job: StageJob) -> StageRun:
    """Make every part not done yet in this process (or its decode workers)."""
    from halsift.corpus.progress import progress

    todo = [p for p in job.parts if not job.done(p)]
    run = StageRun(reused=len(job.parts) - len(todo))
    with progress(total=len(todo), desc=f"{job.stage}: parts", unit="part", disable=not job.show_progress) as bar:
        run.made = _make_all(job, todo, bar)
    return run


def run_task(job: StageJob, num_tasks: int, task_index: int, stale_after: float) -> StageRun:
    """Task ``task_index`` of ``num_tasks``: claim parts (its own share first, then any no one holds), make them;
    returns what it did and the parts still missing after it."""
    from halsift.corpus.progress import progress
    from halsift.filtering.scoring.tasks import HOST, ClaimBoard, task_order

    board = ClaimBoard(Path(job.out), f"{job.stage}-{task_index}@{HOST}:{os.getpid()}", stale_after)
    run = StageRun()
    window = max(1, job.decode_workers)
    order = task_order(list(job.parts), num_tasks, task_index)

    def tally(kind: str) -> None:
        run.reused += kind == "done"

    windows = board.windows(order, window, job.done, tally)
    with progress(desc=f"{job.stage} task {task_index}/{num_tasks}", unit="part",
                  disable=not job.show_progress) as bar, closing(windows):
        for claimed in windows:
            run.made += _make_all(job, [p for p, _ in claimed.values()], bar,
                                  on_made=lambda p: board.finish(p.name, claimed.pop(p.name)[1]))
    run.missing = [p.name for p in job.parts if not job.done(p)]
    if run.missing:
        held = board.held(run.missing)
        run.lines.append(f"{job.stage} task {task_index}/{num_tasks}: {len(run.missing)} parts not written yet "
                         f"({len(held)} held by running tasks)")
    return run


def _call(make: Callable[[StagePart], Any], part: StagePart) -> Any:
    return make(part)  # a Ray task's body (Ray's remote functions are functions, not partials)


def run_ray(job: StageJob, max_failures: int = 3) -> StageRun:
    """One Ray task per part not done (``job.workers`` at a time, default: the cluster's CPUs); a part whose worker
    died is retried up to ``max_failures`` times."""
    from halsift.corpus.progress import progress
    from halsift.filtering.scoring.ray_engine import _ray

    ray = _ray()
    todo = [p for p in job.parts if not job.done(p)]
    run = StageRun(reused=len(job.parts) - len(todo))
    if not todo:
        return run
    if not ray.is_initialized():
        ray.init(address=job.address, log_to_driver=False)
    make = ray.remote(num_cpus=1, max_retries=max_failures)(_call)
    limit = job.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    queue, running = list(todo), {}
    with progress(total=len(todo), desc=f"{job.stage} ray", unit="part", disable=not job.show_progress) as bar:
        while queue or running:
            while queue and len(running) < limit:
                p = queue.pop(0)
                running[make.remote(job.make, p)] = p
            finished, _ = ray.wait(list(running), num_returns=1)
            running.pop(finished[0])
            ray.get(finished[0])
            run.made += 1
            bar.update()
    run.missing = [p.name for p in job.parts if not job.done(p)]
    return run




_G = {"group": "scale-out (independent tasks, SLURM arrays, Ray)"}


@dataclass
class StageFlags:
    """The engine flags of a per-shard corpus stage's command (``halsift basic``, ``dedup``, ``embed``), as score's."""

    engine: Literal["local", "tasks", "ray"] = cfield(
        "local", help="local: this process (tasks when --num-tasks or a SLURM array task's environment is given); "
                      "tasks: one of --num-tasks independent tasks; ray: the parts on a Ray cluster (pip install "
                      "'halsift[ray]')", cli=_G)
    num_tasks: int | None = cfield(None, help="run as one of N independent tasks sharing --out (default: "
                                              "$SLURM_ARRAY_TASK_COUNT in an array job)", cli={**_G, "metavar": "N"})
    task_index: int | None = cfield(None, help="this task's index, 0..N-1 (default: $SLURM_ARRAY_TASK_ID - "
                                               "$SLURM_ARRAY_TASK_MIN)", cli={**_G, "metavar": "I"})
    claim_timeout: float | None = cfield(None, help="take over a part whose claim has had no heartbeat for S "
                                                    "seconds (a dead node; default 600)", cli={**_G, "metavar": "S"})
    address: str | None = cfield(None, help="--engine ray: the cluster to join, e.g. auto or ray://head:10001 "
                                            "(default: a local one)", cli=_G)
    workers: int | None = cfield(None, help="--engine ray: parts made at a time (default: the cluster's CPUs)",
                                 cli=_G)
    decode_workers: int = cfield(0, help="make N parts at a time in as many processes (0: in this process)",
                                 cli={**_G, "metavar": "N"})

    def engine_flags(self) -> dict:
        """The flags as :class:`StageJob` takes them (``engine`` apart)."""
        return {f: getattr(self, f) for f in FLAGS}


__all__ = ["FLAGS", "StageError", "StageFlags", "StageJob", "StagePart", "StageRun", "check_stage", "run_local",
           "run_ray", "run_task"]
