"""The score job: :class:`ScoreJob`, built once from ``halsift score``'s settings (its fields are
:class:`~halsift.filtering.scoring.config.ScoreConfig`'s, declared there once), a recipe's ``score:`` section or a
library call, and run by any engine of the execution layer (:func:`halsift.execution.engines.run_job`).

Opened (:meth:`ScoreJob.open`), it loads its detector, plans one part per shard (or per chunk of a ``bench.jsonl``:
:mod:`.parts`), checks or starts the folder's identity, and hands the engine the parts, the rule that says a part is
done (its record: made from the same input by the same detector, unaltered since) and a :class:`ScoreMaker` (the
detector on its device, torch's threads beside the decode workers). A cascade and a set-level ensemble run as
pipelines of score jobs (:meth:`ScoreJob.staged`). Light to import (no torch).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from halsift.corpus.config import fields_of
from halsift.execution.job import Job, Maker, Outcome, Place, Work, given
from halsift.execution.run_folder import RunFolder
from halsift.filtering.scoring.config import CLI_ONLY, ScoreConfig
from halsift.filtering.scoring.settings import check_settings

_Fields = fields_of(ScoreConfig, "_ScoreJobFields", CLI_ONLY, "ScoreConfig's fields a job carries",
                    first=("detector", "data", "out"), frozen=True)


@dataclass(frozen=True)
class ScoreJob(_Fields, Job):
    """Everything an engine needs to score: ``halsift score``'s settings (:class:`ScoreConfig`) but those of the
    command line alone (:data:`~halsift.filtering.scoring.config.CLI_ONLY`). ``detector``: a spec string, a spec
    file's path, a mapping or a loaded detector."""

    show_progress: bool = True
    # a pipeline's own stage (``"cascade stage"``): recorded in the folder's manifest, so that no reader takes the
    # folder for a score folder of the corpus (:func:`halsift.filtering.selection.score_folder.check_score_folder`)
    role: str = ""
    # the folder a pipeline's stage lies in (a cascade's --out): its path is written ``{root}`` in this folder's
    # identity, so that the whole pipeline folder can be moved or copied and still be the same run
    root: str = ""

    kind = "score"
    ranked = True

    def check(self) -> None:
        self.validate()

    def validate(self) -> None:
        """The job's own checks (:func:`check_settings`), one line naming the setting."""
        check_settings(unit=self.unit, data=self.data, batch_size=self.batch_size,
                       decode_workers=self.decode_workers, max_parse_failures=self.max_parse_failures)

    def settings(self) -> dict:
        """The settings that change what is scored, besides the detector and the inputs: compared when a folder is
        reused (:func:`halsift.execution.run_folder.check_or_start`)."""
        return {"unit": self.unit}

    def run_settings(self) -> dict:
        """The settings that change only how the job runs (of :data:`~halsift.execution.flags.RUN_ONLY`: recorded in
        the manifest, never compared, so changing them never rescores)."""
        return {n: getattr(self, n) for n in ("batch_size", "decode_workers", "device", "max_parse_failures",
                                              "full_hash")}

    def given(self) -> set[str]:
        """The settings set away from their defaults."""
        return given(self)

    def spec(self) -> Any:
        """The detector to build: ``detector``, with ``embeddings=`` given to every CLIP-family detector in it."""
        if not self.embeddings:
            return self.detector
        from halsift.filtering.detectors.embeddings_spec import with_embeddings

        return with_embeddings(self.detector, self.embeddings)

    def staged(self) -> Job:
        """A cascade runs as its staged pipeline (:class:`~halsift.filtering.scoring.cascade.CascadeJob`), a
        set-level detector as its members then the combination (:class:`~.set_level.SetLevelJob`); any other
        detector as this job."""
        from halsift.filtering.scoring.cascade import CascadeJob, is_cascade
        from halsift.filtering.scoring.set_level import SetLevelJob, is_set_level

        if is_cascade(self.detector):
            return CascadeJob(self)
        if is_set_level(self.spec()):
            return SetLevelJob(self)
        return self

    def open(self, place: Place) -> Work:
        from halsift.filtering.scoring.parts import reusable, start_run
        from halsift.filtering.scoring.workers import supports_workers

        run = start_run(self, place)
        fps = run.fps()
        use_workers = self.decode_workers > 0 and supports_workers(run.detector)
        actor_job = dataclasses.replace(self, detector=actor_spec(self.spec(), run.detector), embeddings=None)
        return Work(RunFolder(run.out), run.parts, lambda p: reusable(run.out, p.name, fps[p.name]),
                    partial(ScoreMaker, run.detector, self, fps, place.rank, place.world, use_workers,
                            place.device),
                    partial(_finish, self, run, use_workers), window=self.decode_workers if use_workers else 1,
                    unit="sent", verb="scored", count=_sentences, actor=partial(_actor_maker, actor_job, fps),
                    actor_gpu=True, actor_cpus=1 + self.decode_workers)


def _sentences(stats: dict) -> int:
    return int(stats["sentences"])


class ScoreMaker(Maker):
    """The detector of one process, placed on its device once, scoring whole parts (with decode workers: up to
    one part per worker at a time, :mod:`.workers`), every batch through one :class:`~.guard.ScoreGuard`."""

    def __init__(self, detector, job: ScoreJob, fps: dict, rank: int, world: int, use_workers: bool,
                 device: str | None, cores: int | None = None, respect_env: bool = True) -> None:
        import pyarrow as pa

        from halsift.execution.ranks import task_device
        from halsift.filtering.scoring.guard import ScoreGuard
        from halsift.filtering.scoring.threads import torch_threads

        self.detector = detector.to(job.device or device or task_device())
        pa.array([])  # pyarrow imports pandas on its first array (~0.2 s): start-up work, not the first part's
        self.job, self.fps, self.rank, self.world, self.use_workers = job, fps, rank, world, use_workers
        self.guard = ScoreGuard(detector.name, job.max_parse_failures)
        self._threads = torch_threads(job.decode_workers if use_workers else 0, cores=cores, respect_env=respect_env)
        self.threads = self._threads.__enter__()

    def make(self, parts: Sequence[Any], bar: Any, written: Callable[[str, dict], None]) -> None:
        from halsift.filtering.scoring.parts import score_part
        from halsift.filtering.scoring.workers import score_parts_in_workers

        job, out = self.job, Path(self.job.out)
        if self.use_workers:
            score_parts_in_workers(self.detector, parts, out, job.unit, job.batch_size, job.decode_workers, bar,
                                   self.rank, self.world, self.fps, self.guard, on_part=written)
            return
        for p in parts:
            written(p.name, score_part(self.detector, p, out / p.name, job.unit, job.batch_size, bar, self.rank,
                                       self.world, self.fps[p.name], self.guard))

    def close(self) -> None:
        self._threads.__exit__(None, None, None)


def _actor_maker(job: ScoreJob, fps: dict, index: int, world: int) -> ScoreMaker:
    """A Ray actor's maker: the detector rebuilt from the user's spec (:func:`actor_spec`), torch's threads on the
    actor's own CPUs (``1 + decode_workers``; Ray's ``OMP_NUM_THREADS`` is not the user's)."""
    from halsift.filtering.detectors.spec import load_detector
    from halsift.filtering.scoring.workers import supports_workers

    detector = load_detector(job.spec())
    use = job.decode_workers > 0 and supports_workers(detector)
    return ScoreMaker(detector, job, fps, index, world, use, None, cores=max(1, 1 + job.decode_workers),
                      respect_env=False)


def actor_spec(spec, detector):
    """What Ray actors rebuild the detector from: the spec as the user gave it (a spec file by its absolute path), so
    that each applies the trust rule as this process did (:mod:`~halsift.filtering.detectors.trust`). Not the canonical
    ``detector.spec``: a value read from a file may hold ``,trust_remote_code=true``, an option once re-parsed as
    the user's own text. A detector object given as such has only its canonical spec."""
    from halsift.filtering.detectors.base import Detector

    if isinstance(spec, Detector):
        return detector.spec
    if isinstance(spec, (str, os.PathLike)) and os.path.isfile(spec):
        return os.path.abspath(spec)
    return spec


def _finish(job: ScoreJob, run, use_workers: bool, o: Outcome) -> dict:
    """The complete manifest (:func:`.parts.finish_manifest`) with what the engine did: every task's run (tasks),
    the actors and the parts redone (Ray)."""
    from halsift.filtering.scoring.parts import finish_manifest
    from halsift.filtering.scoring.threads import torch_threads

    threads = o.threads
    if not threads:  # nothing was scored here: the threads this process would have scored with
        with torch_threads(job.decode_workers if use_workers else 0) as threads:
            pass
    extra: dict = {"decode_workers": job.decode_workers if use_workers else 0, "torch_threads": threads}
    if o.engine == "tasks":
        extra.update(engine="tasks", num_tasks=o.world, task_runs=len(o.runs),
                     parts_taken_over=sum(r.get("parts_taken_over", 0) for r in o.runs),
                     tasks={f"{r['task_index']}@{r['host']}:{r['pid']}": {
                         "parts_scored": r["parts_made"], "sentences": r["items"],
                         "scoring_time_s": r["making_time_s"], "parts_taken_over": r["parts_taken_over"]}
                         for r in o.runs})
    elif o.engine == "ray":
        extra.update(engine="ray", **o.extra)
    return finish_manifest(run.out, run.ident, run.parts, o.wall_s, o.items, o.reused, o.world, o.making_s,
                           job.max_parse_failures, extra=extra)


def job_of(cfg, **given) -> ScoreJob:
    """The engine's job from ``cfg`` (a :class:`ScoreConfig`, or a recipe's ``score:`` section: the same names),
    with ``given`` (what a recipe sets itself: detector, data, out) over it; library code never sees argv."""
    names = {f.name for f in dataclasses.fields(ScoreJob)}
    values = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
    values["show_progress"] = not getattr(cfg, "no_progress", False)
    return ScoreJob(**{**values, **given})


__all__ = ["ScoreJob", "ScoreMaker", "actor_spec", "given", "job_of"]
