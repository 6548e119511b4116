"""The library's shorthands for scoring: :func:`score` (a :class:`~halsift.filtering.scoring.job.ScoreJob` on the
local engine: this process, or every rank of a launch) and :func:`score_bench` (a bench's rows as a DataFrame). The
loop itself is the execution layer's (:mod:`halsift.execution.engines`); what a part is, how it is scored and
written, and when it is reused: :mod:`.parts`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from halsift.filtering.scoring.guard import DEFAULT_MAX_PARSE_FAILURES


def score(spec_or_detector, data, out_dir: str | os.PathLike, unit: str = "sentence", batch_size: int = 64,
          device: str | None = None, show_progress: bool = True, workers: int = 0,
          max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES, full_hash: bool = False) -> Path:
    """Score ``data`` (a shard spec or a ``bench.jsonl``) with a detector into ``out_dir``; returns ``out_dir``: a
    :class:`~halsift.filtering.scoring.job.ScoreJob` run by the ``local`` engine (``workers``: the job's
    ``decode_workers``); finished parts are skipped, so rerunning the same call resumes."""
    from halsift.execution.engines import run_job
    from halsift.filtering.scoring.job import ScoreJob

    run_job(ScoreJob(detector=spec_or_detector, data=data, out=out_dir, unit=unit, batch_size=batch_size,
                     device=device, decode_workers=workers, max_parse_failures=max_parse_failures,
                     show_progress=show_progress, full_hash=full_hash))
    return Path(out_dir)


def score_bench(detector, bench_path: str | os.PathLike, out_dir: str | os.PathLike | None = None,
                batch_size: int = 64, device: str | None = None, show_progress: bool = True,
                max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES, decode_workers: int = 0):
    """Score every row of a bench file; returns a DataFrame with ``key`` (row id), ``sentence_index``
    (position), ``score``, ``parsed``, ``detector`` (and ``spans`` when the detector localizes). Stops as
    :func:`score` does (``max_parse_failures``)."""
    from halsift.corpus.scores import read_scores_df

    if out_dir is None:
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            raise ValueError("score_bench: pass out_dir when running on several processes (they must share it)")
        with tempfile.TemporaryDirectory(prefix="halsift-bench-") as tmp:
            score(detector, bench_path, tmp, batch_size=batch_size, device=device, show_progress=show_progress,
                  max_parse_failures=max_parse_failures, workers=decode_workers)
            return read_scores_df(tmp)
    score(detector, bench_path, out_dir, batch_size=batch_size, device=device, show_progress=show_progress,
          max_parse_failures=max_parse_failures, workers=decode_workers)
    return read_scores_df(out_dir)
