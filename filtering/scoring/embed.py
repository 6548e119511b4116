"""``halsift embed``: one encoding pass whose vectors every CLIP-family filter reads (the layout:
:mod:`halsift.corpus.embedding_store`).

Per input shard, one part (named like its score part, :func:`halsift.corpus.scores.part_name`) holding, per valid
sample (the one reader, :func:`halsift.corpus.sample.read_shard`: the samples ``score`` scores), its image vector, its
whole-caption vector and one vector per sentence, L2-normalised float16. A part records in its footer the
fingerprints of its shard and of the model (:func:`halsift.corpus.fingerprint.spec_fingerprint` of the encoder's
identity, checkpoint content included) and its counts; a rerun reuses a part only when both still match, as score
parts are reused, so a killed ``embed`` resumes at the parts it had not written. The parts are split like
``score``'s, by the same engines (:mod:`.engine`): ``local`` (this process, or the ranks of a launch, round-robin)
and ``tasks`` (independent tasks claiming parts, :class:`.tasks.ClaimBoard`); the manifest says ``complete`` once
every part exists, unless nothing was read at all (0-byte or empty tars, every sample skipped) or a key names samples
of two shards: the one empty-input and duplicate-key rules of the stages that read shards
(:func:`halsift.corpus.sample.nothing_read`, :func:`~halsift.corpus.sample.key_in_two_inputs`); then it says
``failed`` and why, and the parts stay. The encoder is a detector that can :meth:`encode` (``clip:...``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from halsift.corpus.embedding_store import (CAPTION, FORMAT, IMAGE, MANIFEST, EmbeddingStoreError, embedding_table,
                                            part_meta, write_embedding_part)
from halsift.corpus.fingerprint import spec_fingerprint
from halsift.corpus.images import SkipCounter
from halsift.corpus.progress import progress
from halsift.corpus.sample import CAPTION_INDEX, key_in_two_inputs, nothing_read, read_shard, repeated_key, \
    sample_items
from halsift.corpus.run_folder import check_or_start, failing, forget_part, part_done, part_reusable
from halsift.corpus.shards import write_json_atomic
from halsift.filtering.scoring.parts import Part, plan_parts, source_fingerprint


@dataclass(frozen=True)
class EmbedJob:
    """What ``halsift embed`` asks an engine to do (built from ``EmbedConfig``)."""

    model: str
    data: str | os.PathLike
    out: str | os.PathLike
    batch_size: int = 64
    device: str | None = None
    show_progress: bool = True
    num_tasks: int | None = None
    task_index: int | None = None
    claim_timeout: float | None = None
    address: str | None = None  # --engine ray
    workers: int | None = None
    decode_workers: int = 0  # embed N parts at a time in as many processes (each loads the encoder once)


def load_encoder(spec):
    """The detector of ``spec`` if it can encode (a CLIP-family detector), else an error naming the spec."""
    from halsift.filtering.detectors.spec import load_detector

    det = load_detector(spec)
    if not (callable(getattr(det, "encode", None)) and getattr(det, "encoder_id", "")):
        raise EmbeddingStoreError(f"--model {det.spec}: {det.family} detectors do not expose image and text "
                                  "embeddings; give a CLIP-family spec (clip:arch=...,pretrained=...)")
    if getattr(det, "lookup", None) is not None:
        raise EmbeddingStoreError(f"--model {det.spec}: drop embeddings= (embed encodes)")
    return det


def embed_part(encoder, part: Part, out_path: Path, batch_size: int, meta: dict, bar=None) -> dict:
    """Embed one shard into one part, written atomically; returns its meta (fingerprints, counts)."""
    t0 = time.perf_counter()
    skipped = SkipCounter(max_examples=1000)
    keys: list[str] = []
    index: list[int] = []
    vectors: list[np.ndarray] = []
    batch: list = []
    samples = 0

    def flush() -> None:
        if not batch:
            return
        img, txt, rows = encoder.encode(encoder.prepare(batch))
        img, txt, rows = img.float().cpu().numpy(), txt.float().cpu().numpy(), rows.cpu().numpy()
        bad = set(getattr(getattr(encoder, "pixels", None), "unreadable", None) or ())  # decode=gpu: none read it
        seen: set[int] = set()
        for i, it in enumerate(batch):
            r = int(rows[i])
            if r in bad:
                if r not in seen:
                    seen.add(r)
                    skipped.add(it.key, "image read by neither the GPU nor the host decoder", "corrupt")
                continue
            if r not in seen:  # the image vector, once per image, before its texts
                seen.add(r)
                keys.append(it.key)
                index.append(IMAGE)
                vectors.append(img[r])
            keys.append(it.key)
            index.append(CAPTION if it.sentence_index == CAPTION_INDEX else it.sentence_index)
            vectors.append(txt[i])
        if bar is not None:
            bar.update(len(batch))
        batch.clear()

    for sample in read_shard(part.source, skipped, draft=encoder.decode_size, arrays=encoder.image_arrays):
        items = sample_items(sample, "caption") + sample_items(sample, "sentence")  # one image: encoded once
        if batch and len(batch) + len(items) > batch_size:
            flush()
        batch.extend(items)
        samples += 1
    flush()
    table = embedding_table(keys, index, np.stack(vectors) if vectors
                            else np.empty((0, int(encoder.embed_dim())), np.float32))
    stats = {**meta, "samples": samples, "images": index.count(IMAGE), "texts": len(index) - index.count(IMAGE),
             "skipped": skipped.to_json(), "wall_s": round(time.perf_counter() - t0, 3)}
    forget_part(out_path.parent, out_path.name)
    write_embedding_part(table, out_path, stats)
    part_done(out_path.parent, out_path.name, _made_from(meta))
    return stats


def _made_from(meta: dict) -> dict:
    return {k: meta[k] for k in ("source_fp", "model_fp", "dim")}


def _reusable(path: Path, meta: dict) -> bool:
    """A written part is reused only when made from the same shard content by the same model, with vectors of the
    model's width, and unaltered since (:func:`~halsift.corpus.run_folder.part_reusable`); a part of an older
    folder, without a record, when its footer and its vectors' width say so."""

    def legacy(p: Path) -> bool:
        got = part_meta(p)
        try:
            width = pq.read_schema(p).field("embedding").type.list_size
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return got.get("source_fp") == meta["source_fp"] and got.get("model_fp") == meta["model_fp"] \
            and width == meta["dim"]

    return part_reusable(path.parent, path.name, _made_from(meta), legacy)


def start(job: EmbedJob):
    """Load the encoder, plan the parts, check or start the folder's manifest; returns
    ``(encoder, out, parts, ident, metas)``."""
    if job.batch_size < 1:
        raise EmbeddingStoreError(f"--batch-size: expected >= 1, got {job.batch_size}")
    if os.fspath(job.data).endswith(".jsonl"):
        raise EmbeddingStoreError(f"--data {job.data}: embed reads shards (a folder, glob or brace pattern of .tar "
                                  "files), not a bench file")
    encoder = load_encoder(job.model)
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    parts, inputs = plan_parts(job.data)
    model_fp = spec_fingerprint(encoder.encoder_id)
    ident = {"format": FORMAT, "model": encoder.encoder_id, "model_spec": encoder.spec, "model_fp": model_fp,
             "dim": int(encoder.embed_dim()), "dtype": "float16", "normalized": True, "inputs": inputs["paths"]}
    check_or_start(out, ident, keys=("format", "model", "dim", "inputs"), what="embeddings", manifest=MANIFEST,
                   error=EmbeddingStoreError, start=False, prefix="--out: ")
    metas = {p.name: {"source": p.source, "source_fp": source_fingerprint(p), "model_fp": model_fp,
                      "dim": ident["dim"]} for p in parts}
    return encoder, out, parts, ident, metas


def written(out: Path, parts: list[Part], metas: dict) -> list[dict]:
    """The records of the parts written (and reusable); once every part is, the rules of every stage that reads
    shards: nothing read at all, or a key naming samples of two shards, raise their one line."""
    have = [part_meta(out / p.name) for p in parts if _reusable(out / p.name, metas[p.name])]
    if len(have) < len(parts):
        return have
    skipped = SkipCounter(max_examples=10_000)
    for m in have:
        skipped.merge(SkipCounter.from_json(m["skipped"]))
    empty = nothing_read(sum(m["samples"] for m in have), skipped.to_json(), "embed")
    if empty:
        raise EmbeddingStoreError(f"--data: {empty}")
    twice = repeated_key([out / p.name for p in parts])
    if twice:
        raise EmbeddingStoreError(key_in_two_inputs(twice[0], parts[twice[1]].source, parts[twice[2]].source,
                                                    "--data"))
    return have


def finish(out: Path, ident: dict, parts: list[Part], have: list[dict], wall: float, embedded: int,
           resumed: int) -> dict:
    """Write the manifest from ``have`` (:func:`written`'s records): ``complete`` when every part is written, with
    the parts' summed counts."""
    skipped = SkipCounter(max_examples=10_000)
    for m in have:
        skipped.merge(SkipCounter.from_json(m["skipped"]))
    manifest = {**ident, "complete": len(have) == len(parts),
                "status": "complete" if len(have) == len(parts) else "running", "parts": len(parts),
                "parts_written": len(have),
                "part_files": [p.name for p in parts], "parts_resumed": resumed, "parts_embedded_this_run": embedded,
                "samples": sum(m["samples"] for m in have), "images": sum(m["images"] for m in have),
                "texts": sum(m["texts"] for m in have), "skipped": skipped.to_json(), "wall_time_s": round(wall, 3)}
    write_json_atomic(out / MANIFEST, manifest)
    return manifest


def _stage(job: EmbedJob, out: Path, parts: list[Part], metas: dict):
    """The parts as a :class:`.stage.StageJob`: the one way every per-shard stage claims and makes its parts."""
    from functools import partial

    from halsift.filtering.scoring.stage import StageJob, StagePart, check_stage

    stage = StageJob("embed", out, [StagePart(p.name, (p,)) for p in parts], partial(_embed_one, job, metas),
                     partial(_embedded, out, metas), show_progress=job.show_progress,
                     decode_workers=job.decode_workers, num_tasks=job.num_tasks, task_index=job.task_index,
                     claim_timeout=job.claim_timeout, address=job.address, workers=job.workers)
    check_stage(stage)
    return stage


def _begin(job: EmbedJob, encoder, device) -> None:
    """This process's encoder, on ``device``, is the one the parts made here use (a decode worker loads its own)."""
    _WORKER_ENCODERS[job.model] = encoder.to(job.device or device)


def embed_local(job: EmbedJob) -> dict:
    """Embed on this process (``decode_workers`` parts at a time in as many processes), or on every rank of a launch
    (parts round-robin); rank 0 writes the manifest."""
    from halsift.filtering.scoring.runner import _reduce, _state
    from halsift.filtering.scoring.stage import run_local

    t0 = time.perf_counter()
    encoder, out, parts, ident, metas = start(job)
    state = _state(job.device)
    _begin(job, encoder, state.device)
    state.wait_for_everyone()
    if state.is_main_process and not (out / MANIFEST).exists():
        write_json_atomic(out / MANIFEST, {**ident, "complete": False, "status": "running"})
    with failing(out, MANIFEST):
        mine = parts[state.process_index::state.num_processes]
        embedded = int(_reduce(state, run_local(_stage(job, out, mine, metas)).made, "sum"))
        state.wait_for_everyone()
        have = written(out, parts, metas)  # on every rank: each stops with a rule's line, none waits for rank 0
        m = {}
        if state.is_main_process:
            m = finish(out, ident, parts, have, time.perf_counter() - t0, embedded, len(parts) - embedded)
        state.wait_for_everyone()
        return m


def embed_task(job: EmbedJob, num_tasks: int, task_index: int, stale_after: float) -> dict:
    """One of ``num_tasks`` independent tasks: claim parts (:func:`.stage.run_task`), embed them; each task writes
    the manifest (``complete`` once every part is written)."""
    from halsift.filtering.scoring.stage import run_task
    from halsift.filtering.scoring.tasks import task_device

    t0 = time.perf_counter()
    encoder, out, parts, ident, metas = start(job)
    _begin(job, encoder, task_device())
    if not (out / MANIFEST).exists():
        write_json_atomic(out / MANIFEST, {**ident, "complete": False, "status": "running"})
    with failing(out, MANIFEST):
        run = run_task(_stage(job, out, parts, metas), num_tasks, task_index, stale_after)
        return finish(out, ident, parts, written(out, parts, metas), time.perf_counter() - t0, run.made,
                      run.reused)


def embed_ray(job: EmbedJob) -> dict:
    """The parts on a Ray cluster (:func:`.stage.run_ray`: one Ray task per part not written, ``job.workers`` at a
    time), each worker process loading the encoder once; then the manifest."""
    from halsift.filtering.scoring.ray_engine import _ray
    from halsift.filtering.scoring.stage import run_ray

    _ray()  # refused in one line before any work when Ray is absent
    t0 = time.perf_counter()
    _, out, parts, ident, metas = start(job)
    if not (out / MANIFEST).exists():
        write_json_atomic(out / MANIFEST, {**ident, "complete": False, "status": "running"})
    with failing(out, MANIFEST):
        run = run_ray(_stage(job, out, parts, metas))
        return finish(out, ident, parts, written(out, parts, metas), time.perf_counter() - t0, run.made,
                      run.reused)


_WORKER_ENCODERS: dict = {}


def _embed_one(job: EmbedJob, metas: dict, part) -> None:
    from halsift.filtering.scoring.tasks import task_device

    p: Part = part.args[0]
    if job.model not in _WORKER_ENCODERS:  # a decode worker or Ray worker: loaded and placed once per process
        _WORKER_ENCODERS[job.model] = load_encoder(job.model).to(job.device or task_device())
    embed_part(_WORKER_ENCODERS[job.model], p, Path(job.out) / p.name, job.batch_size, metas[p.name])


def _embedded(out: Path, metas: dict, part) -> bool:
    return _reusable(out / part.name, metas[part.name])


__all__ = ["EmbedJob", "embed_local", "embed_part", "embed_ray", "embed_task", "load_encoder"]
