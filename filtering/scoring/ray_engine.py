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

import os
import time
from pathlib import Path

from halsift.corpus.progress import progress
from halsift.corpus.shards import write_json_atomic
from halsift.filtering.scoring.parts import MANIFEST, Part, finish_manifest, score_part
from halsift.filtering.detectors.base import Detector
from halsift.filtering.detectors.spec import load_detector
from halsift.filtering.scoring.tasks import TaskError, part_done, start_solo_run, task_device
from halsift.filtering.scoring.guard import DEFAULT_MAX_PARSE_FAILURES, ScoreError, ScoreGuard, check_rate


def _ray():
    try:
        import ray
    except ImportError:
        raise TaskError("--engine ray: Ray is not installed; pip install 'halsift[ray]'") from None
    return ray


class PartScorer:
    """A Ray actor's body: one detector, loaded once, scoring whole parts."""

    def __init__(self, spec: str, unit: str, batch_size: int, device: str | None, out: str, index: int,
                 max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES) -> None:
        self.detector = load_detector(spec)
        self.detector.to(device or task_device())
        self.unit, self.batch_size, self.out, self.index = unit, batch_size, Path(out), index
        self.guard = ScoreGuard(self.detector.name, max_parse_failures)

    def pid(self) -> int:
        return os.getpid()

    def score(self, part: Part, workers: int, fingerprints: dict) -> dict:
        return score_part(self.detector, part, self.out / part.name, self.unit, self.batch_size, None, self.index,
                          workers, fingerprints=fingerprints, guard=self.guard)


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


def score_ray(spec, data, out_dir: str | os.PathLike, *, unit: str = "sentence", batch_size: int = 64,
              device: str | None = None, address: str | None = None, workers: int | None = None,
              max_failures: int = 3, show_progress: bool = True, on_start=None,
              max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES) -> dict:
    """Score ``data`` into ``out_dir`` on Ray; returns the manifest. Joins ``address`` (or the cluster this process
    is already connected to, or a new local one). A part whose actor died is retried up to ``max_failures`` times.
    ``on_start(actors)`` is called once the actors exist (tests use it to kill one)."""
    ray = _ray()
    t0 = time.perf_counter()
    max_parse_failures = check_rate(max_parse_failures)
    detector, out, parts, ident, fps = start_solo_run(spec, data, out_dir, unit, batch_size, "--engine ray")
    todo = [p for p in parts if not part_done(out, p, fps[p.name])]
    resumed = len(parts) - len(todo)
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0)) if device != "cpu" else 0
    n = workers or gpus or int(ray.cluster_resources().get("CPU", 1))
    if n < 1:
        raise TaskError(f"--workers: expected >= 1, got {n}")
    n = max(1, min(n, len(todo))) if todo else 0
    Actor = ray.remote(num_gpus=1 if gpus else 0, num_cpus=0 if gpus else 1)(PartScorer)

    def start(i: int):
        return Actor.remote(actor_spec(spec, detector), unit, batch_size, device, str(out), i, max_parse_failures)

    actors = {i: start(i) for i in range(n)}
    if on_start is not None:
        on_start(actors)
    queue, running, failures, redone = list(todo), {}, {}, 0
    scored, t_scoring = 0, time.perf_counter()

    def give(i: int) -> None:
        if queue:
            part = queue.pop(0)
            running[actors[i].score.remote(part, n, fps[part.name])] = (i, part)

    bar = progress(desc=f"score ray ({n} workers)", unit="part", total=len(todo), disable=not show_progress)
    for i in actors:
        give(i)
    while running:
        done, _ = ray.wait(list(running), num_returns=1)
        i, part = running.pop(done[0])
        try:
            stats = ray.get(done[0])
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            failures[part.name] = failures.get(part.name, 0) + 1
            if failures[part.name] > max_failures:
                raise RuntimeError(f"part {part.name}: its worker died {failures[part.name]} times ({e}); rerun the "
                                   "same command to finish the other parts") from e
            redone += 1
            queue.insert(0, part)
            actors[i] = start(i)  # a replacement for the dead actor
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, ScoreError):  # a guard stopped the run: its one line, not Ray's traceback
                raise ScoreError(str(e.cause)) from None
            raise
        else:
            scored += stats["sentences"]
            bar.update(1)
            bar.set_postfix(sentences=scored, redone=redone)
        give(i)
    bar.close()
    t_scoring = time.perf_counter() - t_scoring
    missing = [p.name for p in parts if not part_done(out, p, fps[p.name])]
    if missing:
        raise RuntimeError(f"{out}: parts {missing[:5]} were not written; rerun the same command to finish")
    m = finish_manifest(out, ident, parts, time.perf_counter() - t0, scored, resumed, n, t_scoring,
                         max_parse_failures=max_parse_failures)
    m.update(engine="ray", workers=n, parts_redone=redone)
    write_json_atomic(out / MANIFEST, m)
    return m
