"""The sharded, resumable scoring runner behind ``halsift score`` and ``eval bench``.

Work is split into *parts*: one per input shard (or per chunk of a ``bench.jsonl``). Parts are dealt
round-robin to the processes of an accelerate ``PartialState`` (``torchrun``/``accelerate launch``, any number
of nodes; gloo on CPU), so no two ranks score the same shard. Each finished part is one parquet file written
atomically (:mod:`halsift.corpus.scores`) whose schema metadata carries its own counts (samples, sentences,
skipped samples with reasons, parse failures, timings) and what it was made from: the fingerprint of its input
(shard size, mtime and sampled hash; for a bench, the bench file's) and of the detector (spec plus the content of
the checkpoints/adapters it names; :mod:`halsift.corpus.fingerprint`). A rerun reuses a finished part only if
both still match and rescores it otherwise; ``_manifest.json`` records detector spec, unit and input paths (and
each part's size, content hash and repeated rows, which select checks), and a rerun with a different spec, unit or
paths raises :class:`RunMismatch`.

Memory: one part's rows and one batch of decoded images at a time, whatever the number of shards.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from halsift.corpus.units import UNITS
from halsift.corpus.fingerprint import spec_fingerprint
from halsift.corpus.progress import progress
from halsift.corpus.scores import scores_table, write_part_atomic
from halsift.filtering.detectors.base import Detector
from halsift.filtering.detectors.spec import load_detector
from halsift.filtering.scoring.part_records import PART_META_KEY
from halsift.filtering.scoring.guard import DEFAULT_MAX_PARSE_FAILURES, ScoreError, ScoreGuard, check_rate
from halsift.filtering.scoring.parts import (Part, _is_bench, check_or_start, finish_manifest,
                                            part_fingerprints, part_stats, plan_parts, reusable, score_part)


def _state(device: str | None):
    """The launch's accelerate state. CPU (gloo) unless a CUDA device is asked for or present: without
    ``cpu=True`` accelerate does not join a CPU-only torchrun group and every rank would think it is alone."""
    import torch
    from accelerate import PartialState

    cpu = device == "cpu" or (device is None and (not torch.cuda.is_available() or bool(os.environ.get(
        "HALSIFT_FORCE_CPU"))))
    from halsift.filtering.scoring.tasks import dist_timeout_kwargs

    return PartialState(cpu=cpu, **dist_timeout_kwargs())  # HALSIFT_DIST_TIMEOUT: barrier timeout in seconds


def score(spec_or_detector, data, out_dir: str | os.PathLike, unit: str = "sentence", batch_size: int = 64,
          device: str | None = None, show_progress: bool = True, workers: int = 0,
          max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES) -> Path:
    """Score ``data`` (a shard spec or a ``bench.jsonl``) with a detector into ``out_dir``; returns ``out_dir``.

    Runs on every process of the current accelerate/torchrun launch (each scores its round-robin share of
    the parts); finished parts are skipped, so rerunning the same call resumes. ``device`` defaults to the
    process's accelerate device ("cpu" forces CPU). ``workers`` > 0: reading, decoding and the detector's
    ``prepare`` step run in that many processes per rank (:mod:`halsift.filtering.scoring.workers`) for detectors
    that have one; else in one read-ahead thread. The run stops with :class:`ScoreError` (one line) on a non-finite
    score, a share of parse failures above ``max_parse_failures``, or nothing scored
    (:mod:`halsift.filtering.scoring.guard`).
    """
    max_parse_failures = check_rate(max_parse_failures)
    if workers < 0:
        raise ValueError(f"workers={workers}: expected >= 0")
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r}: expected one of {UNITS}")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: expected >= 1")
    if _is_bench(data) and unit != "sentence":
        raise ValueError(f"unit={unit!r}: a bench file is scored per sentence (its rows); use unit='sentence'")
    t0 = time.perf_counter()
    detector = load_detector(spec_or_detector)
    state = _state(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts, inputs = plan_parts(data)
    ident = {"detector": detector.spec, "detector_name": detector.name, "unit": unit, "inputs": inputs}
    check_or_start(out, ident, state)

    if detector.set_level:
        return _score_set_level(detector, data, out, ident, parts, unit, batch_size, device, show_progress, state,
                                t0, max_parse_failures)

    rank, world = state.process_index, state.num_processes
    mine = parts[rank::world]
    det_fp = spec_fingerprint(detector.fingerprint_spec())
    fps = part_fingerprints(mine, det_fp)
    todo = [p for p in mine if not reusable(out / p.name, fps[p.name]["source_fp"], det_fp)]
    resumed = int(_reduce(state, len(mine) - len(todo), "sum"))
    scored_now, t_scoring = 0, 0.0
    from halsift.filtering.scoring.threads import torch_threads
    from halsift.filtering.scoring.workers import score_parts_in_workers, supports_workers

    use_workers = bool(workers and todo and supports_workers(detector))
    with torch_threads(workers if use_workers else 0) as threads:
        if todo:
            detector.to(device or state.device)
            pa.array([])  # pyarrow imports pandas on its first array (~0.2 s): start-up work, not the first part's
            ts = time.perf_counter()
            bar = progress(desc=f"score rank {rank}", unit="sent", disable=not show_progress)
            guard = ScoreGuard(detector.name, max_parse_failures)
            if use_workers:
                scored_now = score_parts_in_workers(detector, todo, out, unit, batch_size, workers, bar, rank, world,
                                                    fps, guard)
            else:
                for p in todo:
                    scored_now += score_part(detector, p, out / p.name, unit, batch_size, bar, rank, world,
                                             fps[p.name], guard)["sentences"]
            bar.close()
            t_scoring = time.perf_counter() - ts
    scored_now = int(_reduce(state, scored_now, "sum"))
    t_scoring = _reduce(state, t_scoring, "max")
    state.wait_for_everyone()
    failed = None
    if state.is_main_process:
        missing = [p.name for p in parts if not (out / p.name).exists()]
        if missing:
            raise RuntimeError(f"{out}: parts {missing[:5]} were not written; rerun the same command to finish")
        try:
            finish_manifest(out, {**ident, "detector_fp": det_fp}, parts, time.perf_counter() - t0, scored_now,
                             resumed, world, t_scoring, max_parse_failures,
                             extra={"decode_workers": workers if use_workers else 0, "torch_threads": threads})
        except ScoreError as e:  # raised after the barrier, so the other ranks are not left waiting
            failed = e
    state.wait_for_everyone()
    if failed is not None:
        raise failed
    return out


def _reduce(state, value: float, op: str) -> float:
    """Sum or max of a number over all processes."""
    if state.num_processes == 1:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64,
                     device=state.device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return float(t.item())


def _score_set_level(det: Detector, data, out: Path, ident: dict, parts: list[Part], unit: str, batch_size: int,
                     device, show_progress: bool, state, t0: float,
                     max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES) -> Path:
    """A ``set-level`` detector (an ensemble with set normalisation): score every member over the whole input,
    then combine once (rank 0, :meth:`Detector.combine_scores`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    member_dirs = []
    for i, m in enumerate(det.members):
        d = out / "_members" / f"{i}"
        score(m, data, d, unit=unit, batch_size=batch_size, device=device, show_progress=show_progress,
              max_parse_failures=max_parse_failures)
        member_dirs.append(d)
    if state.is_main_process:
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
            stats = {**part_stats(member_dirs[0] / p.name), "parse_failures": int((~parsed[sel]).sum()),
                     "detector_fp": spec_fingerprint(det.fingerprint_spec())}
            write_part_atomic(table.replace_schema_metadata({PART_META_KEY: json.dumps(stats).encode()}), out / p.name)
        finish_manifest(out, ident, parts, time.perf_counter() - t0, len(ref), 0, state.num_processes,
                         max_parse_failures=max_parse_failures)
    state.wait_for_everyone()
    return out


def score_bench(detector, bench_path: str | os.PathLike, out_dir: str | os.PathLike | None = None,
                batch_size: int = 64, device: str | None = None, show_progress: bool = True,
                max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES):
    """Score every row of a bench file; returns a DataFrame with ``key`` (row id), ``sentence_index``
    (position), ``score``, ``parsed``, ``detector`` (and ``spans`` when the detector localizes). Stops as
    :func:`score` does (``max_parse_failures``)."""
    from halsift.corpus.scores import read_scores_df

    if out_dir is None:
        if _state(device).num_processes > 1:
            raise ValueError("score_bench: pass out_dir when running on several processes (they must share it)")
        with tempfile.TemporaryDirectory(prefix="halsift-bench-") as tmp:
            score(detector, bench_path, tmp, batch_size=batch_size, device=device, show_progress=show_progress,
                  max_parse_failures=max_parse_failures)
            return read_scores_df(tmp)
    score(detector, bench_path, out_dir, batch_size=batch_size, device=device, show_progress=show_progress,
          max_parse_failures=max_parse_failures)
    return read_scores_df(out_dir)
