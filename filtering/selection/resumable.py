"""Selection at scale: out-of-core keys, a key list without resharding, and resharding that resumes per shard.

``select_resumable`` runs in three steps, each leaving a marker only once its output is complete, so that a run
killed anywhere reruns to the identical result (and N processes can share the work, like score tasks):

1. **keys** -- :func:`halsift.filtering.selection.out_of_core.top_keys` writes ``kept.parquet`` (the key list: usable as it
   is, e.g. as a DataComp-style subset file, with ``keys_only``) and the kept units grouped by score part;
   marker ``_select/keys.json``: a one-part job of the execution layer (:class:`~halsift.execution.stage_job.StageJob`)
   that one process makes while the others (tasks) wait for it.
2. **reshard** -- one output shard per input shard, ``NNNNNN.tar`` numbered like the input's position in the
   sorted shard list (an input shard that keeps nothing has none), written from that shard's kept units only;
   marker ``_select/shards/NNNNNN.json`` with its counts: the parts of a job of the execution layer, run by the local
   or the tasks engine, so they are claimed like score parts and a dead process's shard is redone by the next one
   to look.
3. **manifest** -- whoever finds every marker merges them into ``manifest.json`` (``status: complete``) and
   ``sizes.json``: the same fields as :func:`halsift.filtering.selection.select.select`'s manifest. A rerun that finds it
   complete returns it as it is.

The checks and the output folder's state are the in-memory select's (:func:`halsift.filtering.selection.guard.prepare`),
and so is the shard pass's handling of a key repeated within a shard (skipped, counted as ``duplicate``).

Memory: DuckDB's limit for the keys; then one input shard's kept units and one sample at a time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq

from halsift.corpus.images import SkipCounter
from halsift.corpus.scores import part_name
from halsift.corpus.shards import META_DEFAULTS, ShardFormatError, ShardWriter, iter_shard, write_json_atomic
from halsift.filtering.selection.select import KeptCounts, SelectError, _labels, check_amount, kept_by_key, unit_outputs
from halsift.filtering.selection.guard import STATE, prepare, remove_selection, write_outputs
from halsift.filtering.selection.out_of_core import MEMORY_LIMIT, supported, top_keys, kept_for_part
from halsift.execution.claims import STALE_AFTER_S
from halsift.corpus.safe_paths import remove_tree

EXAMPLES = 20


def _make_keys(part) -> None:
    """Step 1's one part: the kept key list and the kept units by part, then its marker."""
    out, scores_dir, args, memory_limit = part.args
    info = top_keys(scores_dir, out, memory_limit=memory_limit, **args)
    write_json_atomic(out / STATE / "keys.json", info)


def _keys_done(part) -> bool:
    return (part.args[0] / STATE / "keys.json").exists()


def _make_shard(part) -> None:
    """Step 2's part for one input shard: its output shard (:func:`reshard_one`), then its marker."""
    i, shard, out, scores_dir, unit, agg, defaults = part.args
    write_json_atomic(out / STATE / "shards" / part.name, reshard_one(i, shard, out, scores_dir, unit, agg, defaults))


def _shard_done(part) -> bool:
    return (part.args[2] / STATE / "shards" / part.name).exists()


def reshard_one(index: int, shard: Path, out: Path, scores_dir: Path, unit: str, agg: str,
                defaults: dict | None = None) -> dict:
    """Step 2 for one input shard: write its kept units to ``out/<index>.tar``; returns its counts. A source
    sample whose outputs the writer rejects is skipped and counted (never the rest of the shard)."""
    defaults = {**META_DEFAULTS, **(defaults or {})}
    skipped = SkipCounter(max_examples=EXAMPLES)
    defaulted: dict[str, int] = {}
    part = part_name(0, shard.name)
    kept = kept_for_part(out, part)
    want = kept_by_key(kept)
    score_part = scores_dir / part
    score_keys = set(pq.read_table(score_part, columns=["key"])["key"].to_pylist()) if score_part.exists() else set()
    counts = KeptCounts(unit == "sentence" or agg == "prune")
    shard_keys, bad_index, corrupt = [], [], []
    work = out / f".{index:06d}.work"
    remove_tree(work, ignore_errors=True)  # what a killed attempt left
    with ShardWriter(work, maxcount=2**62, start_index=index) as writer:
        try:
            for s in iter_shard(shard, skipped):
                shard_keys.append(s.key)
                texts, labels, gts = _labels(s.meta, s.caption)
                counts.add_source(s.captioner, labels)
                if s.key not in want:
                    continue
                idxs = sorted(set(want[s.key]))
                if counts.sentence_level and any(not 0 <= i < len(texts) for i in idxs):
                    bad_index.append(s.key)
                    idxs = [i for i in idxs if 0 <= i < len(texts)]
                    if not idxs:
                        continue
                for k in defaults:
                    if k not in s.meta:
                        defaulted[k] = defaulted.get(k, 0) + 1
                if write_outputs(writer, unit_outputs(s, idxs, unit, agg, texts, gts, defaults), skipped):
                    counts.add_kept(s.captioner, labels, idxs)
        except ShardFormatError as e:
            corrupt.append(f"{shard.name}: {e}")
            skipped.add(shard.name, str(e), "corrupt_shard", n=e.lost or 1)
    sizes = json.loads((work / "sizes.json").read_text()) if (work / "sizes.json").exists() else {}
    for name in sizes:  # 0 or 1 shard, named after the input's index
        os.replace(work / f"{name[:-4]}_stats.json", out / f"{name[:-4]}_stats.json")
        os.replace(work / name, out / name)
    remove_tree(work, ignore_errors=True)
    here = set(shard_keys)
    only_shard = [k for k in shard_keys if k not in score_keys]
    only_scores = sorted(score_keys - here)
    return {"shard": str(shard), "part": part, "sizes": sizes, "samples_written": sum(sizes.values()),
            **counts.to_json(), "shard_keys": len(shard_keys),
            "score_keys": len(score_keys), "only_in_shards": len(only_shard), "only_in_scores": len(only_scores),
            "only_in_shards_examples": only_shard[:EXAMPLES], "only_in_scores_examples": only_scores[:EXAMPLES],
            "bad_index": bad_index[:EXAMPLES], "bad_index_count": len(bad_index), "corrupt": corrupt,
            "skipped": skipped.to_json(), "defaulted": defaulted}


def select_resumable(scores_dir: str | os.PathLike, data, out_dir: str | os.PathLike, *, keep: float | None = None,
                     top_k: int | None = None, threshold: float | None = None, unit: str = "sentence",
                     agg: str = "min", seed: int = 0, keys_only: bool = False, num_tasks: int = 1,
                     task_index: int = 0, memory_limit: str = MEMORY_LIMIT,
                     stale_after: float = STALE_AFTER_S, show_progress: bool = True,
                     allow_partial: bool = False, meta_defaults: dict | None = None,
                     detector: str | None = None, compose=None) -> dict:
    """Select out-of-core and reshard per input shard (see the module docstring); returns this run's stats, with
    ``manifest`` when the selection is complete after it. Rerun the same call to resume. ``compose``: a composed
    selection (:class:`halsift.filtering.selection.compose.Composition`, first folder ``scores_dir``)."""
    t0 = time.time()
    check_amount(keep, top_k, threshold, unit, agg)
    why = supported(unit, agg)
    if why:
        raise SelectError(f"--resumable: not for {why}; run select without it")
    defaults = {**META_DEFAULTS, **(meta_defaults or {})}
    args = dict(keep=keep, top_k=top_k, threshold=threshold, unit=unit, agg=agg, seed=seed)
    prep = prepare(scores_dir, data, out_dir, {**args, "per_captioner": False, "random_baseline": False,
                                               "engine": "resumable", "keys_only": keys_only, "maxcount": None,
                                               **({"compose": compose.record()} if compose is not None else {})},
                   detector=detector, allow_partial=allow_partial, meta_defaults=defaults)
    scores_dir, out, shards, filt, folder = Path(scores_dir), prep.out, prep.shards, prep.filt, prep.folder
    (out / STATE / "shards").mkdir(parents=True, exist_ok=True)
    from halsift.execution.engines import ENGINES
    from halsift.execution.stage_job import StageJob, StagePart

    tasks = {"num_tasks": num_tasks, "task_index": task_index, "claim_timeout": stale_after} if num_tasks > 1 else {}
    engine = ENGINES["tasks" if tasks else "local"]
    keys_args = {**args, "detector": detector if folder.other_detectors else None, "compose": compose}
    keys = StageJob("select", out / STATE, [StagePart("keys.json", (out, scores_dir, keys_args, memory_limit))],
                    _make_keys, _keys_done, show_progress=False, **tasks)
    try:  # one task computes the keys; the others wait for its marker (a dead one's claim is taken over)
        engine.run(keys, wait=True)
    except SelectError:  # e.g. caption-level scores for unit=sentence: refused like the in-memory select, nothing left
        remove_selection(out, prep.created)
        raise
    info = json.loads((out / STATE / "keys.json").read_text())
    run = {"task_index": task_index, "num_tasks": num_tasks, "shards_written": 0, "shards_done_before": 0,
           "samples_written": 0}
    missing = []
    if not keys_only:
        parts = [StagePart(f"{i:06d}.json", (i, shard, out, scores_dir, unit, agg, defaults))
                 for i, shard in enumerate(shards)]
        reshard = StageJob("select", out / STATE / "shards", parts, _make_shard, _shard_done,
                           show_progress=show_progress, **tasks)
        summary = engine.run(reshard)
        run.update(shards_written=summary.run["parts_made"], shards_done_before=summary.run["parts_skipped_done"],
                   samples_written=sum(json.loads((out / STATE / "shards" / n).read_text())["samples_written"]
                                       for n in summary.run.get("made", ())))
        missing = [p.name for p in parts if not _shard_done(p)]
    run["shards_missing"] = len(missing)
    if not missing:
        run["manifest"] = _finish(out, filt, info, shards, scores_dir, keys_only, t0, prep.checks)
    return run


def _finish(out: Path, filt: dict, info: dict, shards: list[Path], scores_dir: Path, keys_only: bool,
            t0: float, checks: dict) -> dict:
    """Step 3: merge the shards' counts into ``manifest.json`` and ``sizes.json`` (a complete manifest another task
    wrote meanwhile is returned as it is)."""
    done = _complete_manifest(out)
    if done is not None:
        return done
    manifest = {"status": "complete", "engine": "resumable", "filter": filt, **info, "scores_check": checks}
    if keys_only:
        manifest.update(kept_units=info["selected"], samples_written=0)
        write_json_atomic(out / "manifest.json", manifest)
        return manifest
    stats = [json.loads((out / STATE / "shards" / f"{i:06d}.json").read_text()) for i in range(len(shards))]
    counts = KeptCounts(filt["unit"] == "sentence" or filt["agg"] == "prune")
    sizes: dict[str, int] = {}
    skipped = SkipCounter(max_examples=1000)
    defaulted: dict[str, int] = {}
    for s in stats:
        counts.merge_json(s)
        sizes.update(s["sizes"])
        skipped.merge(SkipCounter.from_json(s["skipped"]))
        for k, n in s["defaulted"].items():
            defaulted[k] = defaulted.get(k, 0) + n
    # score parts with no input shard: all their keys are only in the scores
    covered = {s["part"] for s in stats}
    orphan = [p for p in sorted(scores_dir.glob("*.parquet")) if p.name not in covered and not p.name.startswith(".")]
    orphan_keys = sorted({k for p in orphan for k in pq.read_table(p, columns=["key"])["key"].to_pylist()})
    write_json_atomic(out / "sizes.json", dict(sorted(sizes.items())))
    manifest.update({
        "score_parts_without_shard": [p.name for p in orphan][:EXAMPLES],
        "samples_written": sum(sizes.values()), **counts.manifest_fields(),
        "keys": {"shards": sum(s["shard_keys"] for s in stats),
                 "scores": sum(s["score_keys"] for s in stats) + len(orphan_keys),
                 "only_in_shards": sum(s["only_in_shards"] for s in stats),
                 "only_in_scores": sum(s["only_in_scores"] for s in stats) + len(orphan_keys),
                 "only_in_shards_examples": [k for s in stats for k in s["only_in_shards_examples"]][:EXAMPLES],
                 "only_in_scores_examples": ([k for s in stats for k in s["only_in_scores_examples"]]
                                             + orphan_keys)[:EXAMPLES]},
        "sentence_index_out_of_range": {"count": sum(s["bad_index_count"] for s in stats),
                                        "examples": [k for s in stats for k in s["bad_index"]][:EXAMPLES]},
        "corrupt_shards": [c for s in stats for c in s["corrupt"]],
        "skipped": skipped.to_json(),
        "skipped_samples": {"count": skipped.counts["bad_sample"],  # the writer's rejects (the engine's older field)
                            "examples": [f"{e['key']}: {e['reason']}" for e in skipped.examples
                                         if e["kind"] == "bad_sample"][:EXAMPLES]},
        "meta_defaults": {"values": filt["meta_defaults"], "samples": dict(sorted(defaulted.items()))},
        "wall_time_s": round(time.time() - t0, 3),
    })
    write_json_atomic(out / "manifest.json", manifest)
    return manifest


def _complete_manifest(out: Path) -> dict | None:
    try:
        m = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("status") == "complete" else None
