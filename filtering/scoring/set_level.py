"""A set-level detector (an ensemble normalised over the whole scored set, ``norm=rank|zscore``) as a pipeline of
score jobs: each member over the whole input into ``OUT/_members/<i>`` (an ordinary job: resumable, split over the
ranks), then the combination, once, on the main process, into the folder's own parts. Refused on the tasks and Ray
engines, whose processes each see a share of the parts only."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from halsift.execution.engines import Engine, EngineError, Summary
from halsift.execution.job import Pipeline

ScoreJob = Any  # a :class:`~halsift.filtering.scoring.job.ScoreJob` (which makes a set-level spec this pipeline)


def is_set_level(spec: Any) -> bool:
    """Whether a spec (string, file, mapping or detector) scores at set level; builds nothing."""
    from halsift.filtering.detectors.base import Detector
    from halsift.filtering.detectors.spec import iter_specs

    if isinstance(spec, Detector):
        return bool(spec.set_level) and spec.family != "cascade"
    try:
        _, family, opts = iter_specs(spec)[0]
    except Exception:  # noqa: BLE001 - a bad spec is reported by the job that builds it
        return False
    return family == "ensemble" and str(opts.get("norm", "none")) != "none"


@dataclasses.dataclass
class SetLevelJob(Pipeline):
    """The members, then their combination (module docstring)."""

    job: ScoreJob
    # member folders other processes have just completed (the recipe's score stage scores members at once): not run
    # again here, where a second run would only find them done and replace the record of the run that made them
    made: frozenset[str] = frozenset()
    kind = "score"

    @property
    def out(self) -> Any:
        return self.job.out

    def member_job(self, i: int, detector: Any) -> ScoreJob:
        """Member ``i``'s score job (``detector``: the member, or a spec that stands for it): the whole input into
        ``OUT/_members/<i>``, without decode workers or stored embeddings."""
        return dataclasses.replace(self.job, detector=detector, out=Path(self.job.out) / "_members" / f"{i}",
                                   embeddings=None, decode_workers=0)

    def run_on(self, engine: Engine) -> Summary:
        from halsift.execution.ranks import rank_place
        from halsift.execution.run_folder import failing
        from halsift.filtering.scoring.parts import start_run

        job = self.job
        if engine.name != "local":
            flag = "--num-tasks" if engine.name == "tasks" else "--engine ray"
            raise EngineError(f"{flag}: {job.detector} scores at set level (e.g. an ensemble's rank/zscore norm "
                              "normalises over the whole set); score each member into its own folder, or run it "
                              f"without {flag}")
        t0 = time.perf_counter()
        place = rank_place(job.device)
        run = start_run(job, place)
        with failing(run.out):
            member_dirs = []
            for i, m in enumerate(run.detector.members):
                member = self.member_job(i, m)
                if str(member.out) not in self.made:
                    engine.execute(member)
                member_dirs.append(Path(member.out))
            m = _combine(job, run, member_dirs, place, t0) if place.is_main else {}
            place.barrier()
        return Summary(engine.name, run.out, True, place.is_main, [], m)


def _combine(job: ScoreJob, run, member_dirs: list[Path], place, t0: float) -> dict:
    """The members' scores combined (:meth:`Detector.combine_scores`) into one part per input part, then the
    manifest."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from halsift.corpus.scores import scores_table, write_part_atomic
    from halsift.execution.run_folder import part_done
    from halsift.filtering.scoring.guard import ScoreGuard
    from halsift.filtering.scoring.part_records import PART_META_KEY
    from halsift.filtering.scoring.parts import finish_manifest, part_footer

    det, out, parts, ident = run.detector, run.out, run.parts, run.ident
    fps = run.fps()
    tables = []
    for d in member_dirs:
        ts = []
        for p in parts:
            t = pq.read_table(d / p.name, columns=["key", "sentence_index", "score", "parsed", "captioner"])
            ts.append(t.append_column("_part", pa.array([p.name] * len(t))))
        t = pa.concat_tables(ts)
        tables.append(t.take(pc.sort_indices(t, [("key", "ascending"), ("sentence_index", "ascending")])))
    ref = tables[0]
    for d, t in zip(member_dirs[1:], tables[1:]):
        if not (t["key"].equals(ref["key"]) and t["sentence_index"].equals(ref["sentence_index"])):
            raise RuntimeError(f"ensemble members scored different rows ({member_dirs[0]} vs {d})")
    scores = det.combine_scores(np.stack([t["score"].to_numpy() for t in tables]))
    parsed = np.logical_and.reduce([t["parsed"].to_numpy(zero_copy_only=False) for t in tables])
    ScoreGuard(det.name, 1.0).check(list(zip(ref["key"].to_pylist(), ref["sentence_index"].to_pylist(),
                                             [""] * len(ref))), scores.tolist(), [True] * len(ref))
    names = ref["_part"].to_numpy(zero_copy_only=False)
    for p in parts:
        sel = np.flatnonzero(names == p.name)
        sub = ref.take(pa.array(sel))
        table = scores_table(sub["key"].to_pylist(), sub["sentence_index"].to_pylist(), scores[sel].tolist(),
                             parsed[sel].tolist(), det.name, {"captioner": sub["captioner"].to_pylist()})
        stats = {**part_footer(member_dirs[0] / p.name), "parse_failures": int((~parsed[sel]).sum()), **fps[p.name]}
        write_part_atomic(table.replace_schema_metadata({PART_META_KEY: json.dumps(stats).encode()}), out / p.name)
        part_done(out, p.name, fps[p.name])
    return finish_manifest(out, ident, parts, time.perf_counter() - t0, len(ref), 0, place.world,
                           max_parse_failures=job.max_parse_failures)


__all__ = ["SetLevelJob", "is_set_level"]
