"""``halsift score --engine ray``: score the parts on a Ray cluster, one actor per GPU, parts dealt as actors free up.

Ray is an optional extra (``pip install 'halsift[ray]'``), imported only here. The driver plans the parts
(:func:`parts.plan_parts`), starts ``workers`` actors that each load the detector once, and hands the next unfinished
part to whichever actor finishes first (dynamic load balancing: a slow node simply takes fewer parts). Each actor
writes its part atomically into the same folder the other engines write, so ``select`` reads it as it is. When an
actor dies (its node, or a SIGKILL), the driver starts a replacement and gives the part it held to the next free
actor; a part is written only by the actor that finished it. The manifest (``engine: ray``) is written by the driver
once every part exists; a rerun (any engine) skips finished parts.

Ray actors over parts rather than Ray Data ``map_batches``: the output contract is one parquet part per input shard
with its own stats, which Ray Data's writers do not produce (they name and split files themselves), and a part as
the unit of work is what makes a dead worker cost one part, not a whole stage.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from halsift.corpus.progress import progress
from halsift.corpus.run_folder import failing
from halsift.corpus.shards import write_json_atomic
from halsift.filtering.scoring.parts import MANIFEST, Part, finish_manifest, score_part
from halsift.filtering.detectors.base import Detector
from halsift.filtering.detectors.spec import load_detector
from halsift.filtering.scoring.tasks import TaskError, part_done, start_solo_run, task_device
from halsift.filtering.scoring.guard import ScoreError, ScoreGuard


def _ray():
    try:
        import ray
    except ImportError:
        raise TaskError("--engine ray: Ray is not installed; pip install 'halsift[ray]'") from None
    return ray


class PartScorer:
    """A Ray actor's body: one detector, loaded once, scoring whole parts. ``decode_workers`` > 0: each call's parts
    are read, decoded and prepared in that many processes (:mod:`.workers`), with torch's threads set to the
    actor's other cores (:mod:`.threads`; the actor reserves ``1 + decode_workers`` CPUs, or ``decode_workers``
    beside a GPU, and Ray's own ``OMP_NUM_THREADS`` for it is not the user's choice)."""

    def __init__(self, job, index: int, cores: int = 1) -> None:
        from halsift.filtering.scoring.threads import torch_threads
        from halsift.filtering.scoring.workers import supports_workers

        self.detector = load_detector(job.spec())
        self.detector.to(job.device or task_device())
        self.unit, self.batch_size, self.out, self.index = job.unit, job.batch_size, Path(job.out), index
        self.guard = ScoreGuard(self.detector.name, job.max_parse_failures)
        self.decode_workers = job.decode_workers if supports_workers(self.detector) else 0
        self._threads = torch_threads(self.decode_workers, cores=cores, respect_env=False)
        self.threads = self._threads.__enter__()  # for the actor's life

    def pid(self) -> int:
        return os.getpid()

    def score(self, parts: list[Part], workers: int, fingerprints: dict) -> dict:
        """Score ``parts`` (one, or up to one per decode worker); returns their stats by part name and the
        actor's ``torch_threads``."""
        stats: dict[str, dict] = {}
        if self.decode_workers:
            from halsift.filtering.scoring.workers import score_parts_in_workers

            score_parts_in_workers(self.detector, parts, self.out, self.unit, self.batch_size, self.decode_workers,
                                   None, self.index, workers, fingerprints, self.guard,
                                   on_part=lambda name, s: stats.__setitem__(name, s))
        else:
            for part in parts:
                stats[part.name] = score_part(self.detector, part, self.out / part.name, self.unit, self.batch_size,
                                              None, self.index, workers, fingerprints=fingerprints[part.name],
                                              guard=self.guard)
        return {"parts": stats, "torch_threads": self.threads, "decode_workers": self.decode_workers}


def actor_spec(spec, detector: Detector):
    """What the actors rebuild the detector from: the spec as the user gave it (a spec file by its absolute path), so
    that each applies the trust rule as this process did (:mod:`~halsift.filtering.detectors.trust`). Not the canonical
    ``detector.spec``: a value read from a file may hold ``,trust_remote_code=true``, an option once re-parsed as
    the user's own text. A detector object given as such has only its canonical spec."""
    if isinstance(spec, Detector):
        return detector.spec
    if isinstance(spec, (str, os.PathLike)) and os.path.isfile(spec):
        return os.path.abspath(spec)
    return spec


def score_ray(job, *, max_failures: int = 3, on_start=None) -> dict:
    """Score ``job`` (a :class:`~halsift.filtering.scoring.engine.ScoreJob`, passed whole) on Ray; returns the
    manifest. Joins ``job.address`` (or the cluster this process is already connected to, or a new local one), with
    ``job.workers`` actors. A part whose actor died is retried up to ``max_failures`` times. ``job.decode_workers``
    > 0: each actor reads its parts in that many processes (:class:`PartScorer`) and is dealt up to that many parts
    at a time. ``on_start(actors)`` is called once the actors exist (tests use it to kill one)."""
    ray = _ray()
    t0 = time.perf_counter()
    run = start_solo_run(job, "--engine ray")
    with failing(run.out):
        return _score_ray(ray, job, run, max_failures, on_start, t0)


def _score_ray(ray, job, run, max_failures: int, on_start, t0: float) -> dict:
    detector, out, parts, ident = run.detector, run.out, run.parts, run.ident
    fps = run.fps()
    device, workers, decode_workers = job.device, job.workers, job.decode_workers
    address, show_progress = job.address, job.show_progress
    todo = [p for p in parts if not part_done(out, p, fps[p.name])]
    resumed = len(parts) - len(todo)
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0)) if device != "cpu" else 0
    n = workers or gpus or int(ray.cluster_resources().get("CPU", 1))
    if n < 1:
        raise TaskError(f"--workers: expected >= 1, got {n}")
    n = max(1, min(n, len(todo))) if todo else 0
    cpus = (0 if gpus else 1) + decode_workers  # the model's core (none beside a GPU) and one per decode worker
    Actor = ray.remote(num_gpus=1 if gpus else 0, num_cpus=cpus)(PartScorer)

    actor_job = dataclasses.replace(job, detector=actor_spec(job.spec(), detector), embeddings=None)

    def start(i: int):
        return Actor.remote(actor_job, i, max(1, cpus))

    actors = {i: start(i) for i in range(n)}
    if on_start is not None:
        on_start(actors)
    queue, running, failures, redone = list(todo), {}, {}, 0
    scored, t_scoring, threads = 0, time.perf_counter(), {}
    per_call = max(1, decode_workers)  # with decode workers an actor reads one part per worker at a time

    def give(i: int) -> None:
        if queue:
            chunk, queue[:per_call] = queue[:per_call], []
            running[actors[i].score.remote(chunk, n, {p.name: fps[p.name] for p in chunk})] = (i, chunk)

    bar = progress(desc=f"score ray ({n} workers)", unit="part", total=len(todo), disable=not show_progress)
    for i in actors:
        give(i)
    while running:
        done, _ = ray.wait(list(running), num_returns=1)
        i, chunk = running.pop(done[0])
        try:
            result = ray.get(done[0])
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            lost = [p for p in chunk if not part_done(out, p, fps[p.name])]  # parts it wrote before dying stay
            for part in lost:
                failures[part.name] = failures.get(part.name, 0) + 1
                if failures[part.name] > max_failures:
                    raise RuntimeError(f"part {part.name}: its worker died {failures[part.name]} times ({e}); rerun "
                                       "the same command to finish the other parts") from e
            redone += len(lost)
            queue[:0] = lost
            bar.update(len(chunk) - len(lost))
            actors[i] = start(i)  # a replacement for the dead actor
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, ScoreError):  # a guard stopped the run: its one line, not Ray's traceback
                raise ScoreError(str(e.cause)) from None
            raise
        else:
            scored += sum(s["sentences"] for s in result["parts"].values())
            threads = {"decode_workers": result["decode_workers"], "torch_threads": result["torch_threads"]}
            bar.update(len(chunk))
            bar.set_postfix(sentences=scored, redone=redone)
        give(i)
    bar.close()
    t_scoring = time.perf_counter() - t_scoring
    missing = [p.name for p in parts if not part_done(out, p, fps[p.name])]
    if missing:
        raise RuntimeError(f"{out}: parts {missing[:5]} were not written; rerun the same command to finish")
    m = finish_manifest(out, ident, parts, time.perf_counter() - t0, scored, resumed, n, t_scoring,
                         max_parse_failures=job.max_parse_failures, extra=threads)
    m.update(engine="ray", workers=n, parts_redone=redone)
    write_json_atomic(out / MANIFEST, m)
    return m
