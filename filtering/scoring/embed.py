"""``halsift embed``: one encoding pass whose vectors every CLIP-family filter reads (the layout:
:mod:`halsift.corpus.embedding_store`).

Per input shard, one part (named like its score part, :func:`halsift.corpus.scores.part_name`) holding, per valid
sample (the one reader, :func:`halsift.corpus.sample.read_shard`: the samples ``score`` scores), its image vector, its
whole-caption vector and one vector per sentence, L2-normalised float16. A part records in its footer the
fingerprints of its shard and of the model (:func:`halsift.corpus.fingerprint.spec_fingerprint` of the encoder's
identity, checkpoint content included) and its counts; a rerun reuses a part only when both still match, as score
parts are reused, so a killed ``embed`` resumes at the parts it had not written. :class:`EmbedJob` is a job of the
execution layer (:mod:`halsift.execution.engines`): ``local`` (this process, or the ranks of a launch, round-robin),
``tasks`` (independent tasks claiming parts) and ``ray``; the manifest says ``complete`` once
every part exists, unless nothing was read at all (0-byte or empty tars, every sample skipped) or a key names samples
of two shards: the one empty-input and duplicate-key rules of the stages that read shards
(:func:`halsift.corpus.sample.nothing_read`, :func:`~halsift.corpus.sample.key_in_two_inputs`); then it says
``failed`` and why, and the parts stay. The encoder is a detector that can :meth:`encode` (``clip:...``).
"""

from __future__ import annotations

import dataclasses
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
from halsift.corpus.config import field, fields_of
from halsift.corpus.shards import write_json_atomic
from halsift.execution.flags import EngineFlags
from halsift.execution.job import Job, Outcome, Place, Work
from halsift.execution.run_folder import check_or_start, forget_part, part_done, part_reusable
from halsift.execution.stage_job import StageJob, StageMaker, StagePart
from halsift.filtering.scoring.parts import Part, plan_parts, source_fingerprint


@dataclass
class EmbedConfig(EngineFlags):
    """``halsift embed``'s settings (its flags, ``--describe`` and docs/config.md); :class:`EmbedJob` carries them."""

    model: str = field("", help="a CLIP-family detector spec, e.g. clip:arch=ViT-B-32,pretrained=openai (its "
                                "arch, weights, seed and fast_decode decide the vectors)",
                       cli={"required": True, "metavar": "SPEC"})
    data: str = field("", help="shard folder / glob / brace pattern", cli={"required": True})
    out: str = field("", help="output folder: one parquet part per shard + _manifest.json", cli={"required": True})
    batch_size: int = field(64, range="[1, inf)",
                            help="texts per model call (a sample's image, caption and sentences stay together)")
    device: str | None = field(None, help="cpu, cuda, cuda:1 ... (default: the process's accelerate device)")
    no_progress: bool = field(False, help="no progress bar")


_Fields = fields_of(EmbedConfig, "_EmbedJobFields", ("engine", "no_progress"), "EmbedConfig's fields a job carries",
                    first=("model", "data", "out"), frozen=True)


@dataclass(frozen=True)
class EmbedJob(_Fields, Job):
    """What ``halsift embed`` asks an engine to do: :class:`EmbedConfig`'s settings but the command line's own."""

    show_progress: bool = True

    kind = "embed"
    ranked = True

    def refuses(self, engine: str) -> dict:
        return {"decode_workers": "on --engine ray makes --workers parts at a time; drop --decode-workers"} \
            if engine == "ray" else {}

    def check(self) -> None:
        if self.batch_size < 1:
            raise EmbeddingStoreError(f"--batch-size: expected >= 1, got {self.batch_size}")
        if os.fspath(self.data).endswith(".jsonl"):
            raise EmbeddingStoreError(f"--data {self.data}: embed reads shards (a folder, glob or brace pattern of "
                                      ".tar files), not a bench file")

    def open(self, place: Place) -> Work:
        from functools import partial

        encoder, out, parts, ident, metas = start(self)
        if place.is_main and not (out / MANIFEST).exists():
            write_json_atomic(out / MANIFEST, {**ident, "complete": False, "status": "running"})
        place.barrier()
        stage = StageJob("embed", out, [StagePart(p.name, (p,)) for p in parts], partial(_embed_one, self, metas),
                         partial(_embedded, out, metas), manifest=MANIFEST, decode_workers=self.decode_workers)

        def maker() -> StageMaker:
            _WORKER_ENCODERS[self.model] = encoder.to(self.device or place.device or _device())
            return StageMaker(stage.make, self.decode_workers)

        def finish(o: Outcome) -> dict:
            return _finish(out, ident, parts, written(out, parts, metas), o.wall_s, o.made, o.reused)

        work = stage.open(place)
        return dataclasses.replace(work, maker=maker, finish=finish, verb="embedded")


def job_of(cfg: EmbedConfig, **given) -> EmbedJob:
    """The job of ``halsift embed``'s settings ``cfg`` (``given`` over them)."""
    names = {f.name for f in dataclasses.fields(EmbedJob)}
    values = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
    return EmbedJob(**{**values, "show_progress": not cfg.no_progress, **given})


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
    model's width, and unaltered since (:func:`~halsift.execution.run_folder.part_reusable`); a part of an older
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


def _finish(out: Path, ident: dict, parts: list[Part], have: list[dict], wall: float, embedded: int,
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


_WORKER_ENCODERS: dict = {}


def _device() -> str:
    from halsift.execution.ranks import task_device

    return task_device()


def _embed_one(job: EmbedJob, metas: dict, part) -> None:
    p: Part = part.args[0]
    if job.model not in _WORKER_ENCODERS:  # a decode worker or Ray actor: loaded and placed once per process
        _WORKER_ENCODERS[job.model] = load_encoder(job.model).to(job.device or _device())
    embed_part(_WORKER_ENCODERS[job.model], p, Path(job.out) / p.name, job.batch_size, metas[p.name])


def _embedded(out: Path, metas: dict, part) -> bool:
    return _reusable(out / part.name, metas[part.name])


__all__ = ["EmbedConfig", "EmbedJob", "embed_part", "job_of", "load_encoder"]
