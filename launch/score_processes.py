"""The score stage's door for one job (:func:`run_score_job`), and its detectors at once on a CPU (issue 52).

Each detector, and each member of a set-level ensemble, scores its inputs (corpus, bench, calibration) in its own
spawned process with one intra-op thread, before the stage's ordinary pass, which then scores what is left (random,
oracle, cascades) and combines the ensembles. Each job goes through the one door; only where it runs changes, and
the folders' records decide what is done (:mod:`halsift.execution.run_folder`). On the quickstart's 2 cores the
stage takes 104 s instead of 132 s: the yes/no judge gains 15 % from a second thread, the PMI judge 50 %, a second
process nearly 100 %.

Scores equal the one-process run's to floating-point rounding (one thread instead of several); no identity records
the thread count, so a folder made either way is reused by the other.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe

CHEAP = ("random", "oracle")  # families that score in no time: left to the ordinary pass


@dataclasses.dataclass(frozen=True)
class Task:
    """One process's share: detector ``name`` loaded once from ``spec`` (member ``member`` of it, for a set-level
    ensemble) and its ``jobs`` run one after another."""

    name: str
    spec: str
    member: int | None
    jobs: tuple

    @property
    def label(self) -> str:
        return self.name if self.member is None else f"{self.name} (member {self.member})"


def score_processes(r: Recipe, ranks: Any, device: str) -> int:
    """Processes the score stage scores in at once: ``score.jobs`` (0: one per core this process may use) on a CPU
    ``device``, outside a multi-process launch (``ranks``), on the local engine, without decode workers; else 1
    (one after another)."""
    from halsift.filtering.scoring.threads import process_cores

    if (ranks is not None or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 or r.score.engine != "local"
            or r.score.decode_workers or device != "cpu"):
        return 1
    return max(1, r.score.jobs or process_cores())


def plan_tasks(jobs_of: dict[str, list]) -> list[Task]:
    """The processes' tasks from each detector's score jobs (``detector``: its spec): a set-level ensemble's
    members first (the longest work of a recipe, and they depend on nothing), then the other detectors in the
    recipe's order; random and oracle, which cost nothing, left out. A set-level ensemble's folders are started
    here (:func:`_start_set_level`), so that its members' processes never race to empty them."""
    from halsift.filtering.detectors.spec import iter_specs
    from halsift.filtering.scoring.set_level import SetLevelJob

    members, others = [], []
    for name, jobs in jobs_of.items():
        if not jobs:
            continue
        spec = jobs[0].detector
        family = iter_specs(spec)[0][1]
        if family in CHEAP:
            continue
        staged = [j.staged() for j in jobs]
        if not isinstance(staged[0], SetLevelJob):
            others.append(Task(name, spec, None, tuple(jobs)))
            continue
        count = _start_set_level(spec, staged)
        members += [Task(name, spec, i, tuple(s.member_job(i, spec) for s in staged)) for i in range(count)]
    return members + others


def _start_set_level(spec: str, staged: list) -> int:
    """Check or start each folder of a set-level ensemble as its own run would
    (:func:`~halsift.filtering.scoring.parts.start_run`; one holding another run is emptied); returns the number of
    members."""
    from halsift.execution.job import Place
    from halsift.filtering.detectors.spec import load_detector
    from halsift.filtering.scoring.parts import start_run

    detector = load_detector(spec)  # once, for all its folders
    for s in staged:
        job = dataclasses.replace(s.job, detector=detector)
        emptied_on_mismatch(Path(job.out), lambda job=job: start_run(job, Place()))
    return len(detector.members)


def score_at_once(jobs_of: dict[str, list], processes: int, run: Path) -> set[str]:
    """Run :func:`plan_tasks`' tasks ``processes`` at a time (spawned, one thread each); a line as each one ends,
    with its sentences and throughput. Returns the folders completed (``out`` of every job run). The first failure
    stops the pool and is raised. ``run``: the run folder (no process removes anything outside it)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    tasks = plan_tasks(jobs_of)
    if len(tasks) < 2:
        return set()
    processes = min(processes, len(tasks))
    print(f"[halsift run] score: {len(tasks)} detectors and ensemble members, {processes} at a time (one thread "
          "each)", flush=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = {pool.submit(_run_task, t, run): t for t in tasks}
        ended, made = 0, set()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                task = pending.pop(f)
                if f.exception() is not None:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise f.exception()
                sentences, seconds = f.result()
                made.update(str(j.out) for j in task.jobs)
                ended += 1
                print(f"[halsift run] score: {task.label} done ({ended}/{len(tasks)}): {sentences:,} sentences in "
                      f"{seconds:.1f} s ({sentences / max(seconds, 1e-9):,.0f}/s; {time.perf_counter() - t0:.0f} s "
                      "so far)", flush=True)
    return made


def _run_task(task: Task, run: Path) -> tuple[int, float]:
    """A task in a worker process: its detector loaded once, torch on one thread, each job through the recipe's door
    (a job that reads stored embeddings builds its own detector from its spec); like the parent, it removes nothing
    outside the run folder. Returns the sentences its jobs scored and its seconds."""
    import torch

    from halsift.corpus.safe_paths import confined_to
    from halsift.filtering.detectors.spec import load_detector

    t0 = time.perf_counter()
    torch.set_num_threads(1)
    sentences = 0
    with confined_to(run):
        detector = load_detector(task.spec)
        if task.member is not None:
            detector = detector.members[task.member]
        for job in task.jobs:
            job = dataclasses.replace(job, show_progress=False)  # the parent prints a line per task instead
            run_score_job(job if job.embeddings else dataclasses.replace(job, detector=detector))
            sentences += _scored(Path(job.out))
    return sentences, time.perf_counter() - t0


def _scored(out: Path) -> int:
    """The sentences a score folder's manifest says this run scored (0 when none is recorded)."""
    from halsift.execution.run_folder import read_record

    record = read_record(out / "_manifest.json") or {}
    return int(record.get("sentences_scored_this_run", 0) or 0)


def run_score_job(job, engine: str = "local") -> None:
    """A score job of the recipe through the same door as the command (:func:`~halsift.execution.engines.run_job`),
    on ``engine`` (the recipe's ``score.engine``). The folder is the recipe's own: when it holds another detector's
    scores (the name now has another spec, or its inputs changed), it is emptied and scored again; the other folders
    are untouched."""
    from halsift.execution.engines import run_job

    result = emptied_on_mismatch(Path(job.out), lambda: run_job(job, engine))
    if not result.complete:
        raise RuntimeError(f"{job.out}: the score run did not complete ({'; '.join(result.lines)}); rerun the recipe")


def emptied_on_mismatch(out: Path, run):
    """``run()``; when the folder ``out`` holds another run (another detector, other inputs), it is emptied and
    ``run()`` called once more."""
    from halsift.corpus.safe_paths import remove_tree
    from halsift.filtering.scoring.cascade import CascadeMismatch
    from halsift.filtering.scoring.parts import RunMismatch

    try:
        return run()
    except (RunMismatch, CascadeMismatch) as e:
        print(f"[halsift run] {out}: {e}; emptying it and scoring again", flush=True)
        remove_tree(out)
        return run()


__all__ = ["Task", "emptied_on_mismatch", "plan_tasks", "run_score_job", "score_at_once", "score_processes"]
