"""A per-part stage with no model of its own (``basic``, dedup's hash and encode parts, the decontaminated corpus
copy, a selection's shards): a list of named parts, a picklable ``make(part)`` that writes one part into the stage's
folder (atomically, with its :mod:`.run_folder` record) and a ``done(part)`` that says whether a part may be reused.
Any engine runs it (:mod:`.engines`); ``decode_workers`` > 0 makes that many parts at a time in as many processes
(spawned: each imports what ``make`` needs, nothing is forked mid-run)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from halsift.execution.job import ENGINE_FLAGS, Job, Maker, Outcome, Place, Work
from halsift.execution.run_folder import MANIFEST, RunFolder


@dataclass(frozen=True)
class StagePart:
    """One part of a stage: its file name in the stage's folder and what ``make`` needs to write it."""

    name: str
    args: tuple = ()


def _stats(outcome: Outcome) -> dict:
    return {"parts": outcome.made + outcome.reused, "made": outcome.made, "reused": outcome.reused}


@dataclass(frozen=True)
class StageJob(Job):
    """A per-part stage run on an engine. ``make``/``done`` must pickle (module-level functions or partials of them)
    when ``decode_workers`` > 0 or on Ray. ``stage``: its command's name (messages); ``manifest``: the folder's record
    (marked ``failed`` when a part's making raises); ``honours``/``why_not``: the engine flags it honours and why it
    refuses the others; ``finish``: what to return once every part is done (default: the counts)."""

    stage: str
    out: Path
    parts: Sequence[StagePart]
    make: Callable[[StagePart], Any]
    done: Callable[[StagePart], bool]
    honours: frozenset = frozenset(ENGINE_FLAGS)
    why_not: Mapping[str, str] = field(default_factory=dict)
    manifest: str = MANIFEST
    show_progress: bool = True
    finish: Callable[[Outcome], dict] = _stats
    decode_workers: int = 0
    num_tasks: int | None = None
    task_index: int | None = None
    claim_timeout: float | None = None
    address: str | None = None
    workers: int | None = None

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.stage

    def open(self, place: Place) -> Work:
        return Work(RunFolder(self.out, self.manifest), list(self.parts), self.done,
                    lambda: StageMaker(self.make, self.decode_workers), self.finish,
                    window=max(1, self.decode_workers), actor=_StageActor(self.make))


class StageMaker(Maker):
    """Makes parts here, or ``decode_workers`` at a time in as many spawned processes."""

    def __init__(self, make: Callable[[StagePart], Any], decode_workers: int = 0) -> None:
        self.make_one, self.decode_workers = make, decode_workers
        self._pool = None

    def make(self, parts: Sequence[StagePart], bar: Any, written: Callable[[str, dict], None]) -> None:
        if self.decode_workers > 0 and len(parts) > 1:
            from concurrent.futures import FIRST_COMPLETED, wait

            if self._pool is None:
                import multiprocessing as mp
                from concurrent.futures import ProcessPoolExecutor

                self._pool = ProcessPoolExecutor(self.decode_workers, mp_context=mp.get_context("spawn"))
            pending = {self._pool.submit(self.make_one, p): p for p in parts}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    p = pending.pop(f)
                    f.result()
                    written(p.name, {})
                    if bar is not None:
                        bar.update()
            return
        for p in parts:
            self.make_one(p)
            written(p.name, {})
            if bar is not None:
                bar.update()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


@dataclass(frozen=True)
class _StageActor:
    """A Ray actor's maker of a stage (picklable: the stage's ``make``)."""

    make: Callable[[StagePart], Any]

    def __call__(self, index: int, world: int) -> StageMaker:
        return StageMaker(self.make)


__all__ = ["StageJob", "StageMaker", "StagePart"]
