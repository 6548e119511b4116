"""The part store of a score folder: what a part is (one input shard, or a chunk of a ``bench.jsonl``), how its
items are read (:func:`iter_caption_groups`, through the one reader), scored and written (:func:`score_part`: one
parquet file, atomically, carrying its own stats and the fingerprints of what it was made from), when a finished
part is reused (:func:`reusable`), and the folder's ``_manifest.json`` (:func:`check_or_start`,
:func:`finish_manifest`). The score job (:mod:`.job`) builds on it, with decode workers (:mod:`.workers`), for every
engine of the execution layer (:mod:`halsift.execution.engines`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from halsift.corpus.fingerprint import file_fingerprint, path_fingerprint, spec_fingerprint
from halsift.corpus.images import ImageDecodeError, SkipCounter, load_image_file
from halsift.corpus.percent import percent
from halsift.execution.run_folder import check_or_start as check_folder, forget_part, part_done, part_reusable
from halsift.corpus.sample import bench_items, key_in_two_inputs, read_shard, repeated_key, sample_items
from halsift.corpus.scores import part_name, scores_table, write_part_atomic
from halsift.corpus.shards import expand_shards, write_json_atomic
from halsift.filtering.detectors.base import Detector, Item
from halsift.filtering.scoring.settings import is_bench
from halsift.filtering.scoring.guard import DEFAULT_MAX_PARSE_FAILURES, ScoreError, ScoreGuard, final_check
from halsift.filtering.scoring.part_records import PART_META_KEY, RECORDS, part_record
from halsift.filtering.scoring.prefetch import Prefetcher

MANIFEST = "_manifest.json"
BENCH_CHUNK = 512  # captions per part when scoring a bench file


class RunMismatch(ValueError):
    """An output folder already holds scores from a different detector spec, unit or inputs."""


@dataclass
class Part:
    name: str  # parquet file name
    source: str  # shard path, or "bench.jsonl#i"
    captions: list | None = None  # bench: list of row groups (one per caption)


# ---------------------------------------------------------------------------------------------- inputs
def plan_parts(data) -> tuple[list[Part], dict]:
    """Split the input into parts; returns ``(parts, inputs)`` where ``inputs`` identifies the data."""
    if is_bench(data):
        from halsift.corpus.bench import read_bench

        path = Path(data).resolve()
        groups: dict[str, list] = {}
        for row in read_bench(path):
            groups.setdefault(row.caption_id, []).append(row)
        caps = [sorted(g, key=lambda r: r.position) for g in groups.values()]
        # Captions of one image next to each other (in first-appearance order), so that they share one decoded
        # image and land in the same batches: detectors encode each distinct image once per batch.
        first = {img: i for i, img in enumerate(dict.fromkeys(c[0].image for c in caps))}
        caps.sort(key=lambda c: first[c[0].image])
        parts = [Part(part_name(0, f"bench-{i // BENCH_CHUNK:05d}"), f"{path}#{i // BENCH_CHUNK}",
                      caps[i:i + BENCH_CHUNK]) for i in range(0, len(caps), BENCH_CHUNK)]
        return parts, {"kind": "bench", "paths": [str(path)]}
    shards = expand_shards(data)
    names = [part_name(0, s.name) for s in shards]
    if len(set(names)) != len(names):
        raise ValueError(f"data: shard basenames repeat across folders in {data!r}; score each folder separately")
    parts = [Part(n, str(s)) for n, s in zip(names, shards)]
    return parts, {"kind": "shards", "paths": [str(s.resolve()) for s in shards]}


def iter_caption_groups(part: Part, unit: str, skipped: SkipCounter, decode: bool = True,
                        draft: int | None = None, arrays: bool = False) -> Iterator[list[Item]]:
    """Yield the items of one caption at a time; bad samples are counted in ``skipped`` and left out. ``draft``:
    JPEGs decode at a reduced scale down to that side (a detector's ``decode_size``). ``arrays``: shard images
    come as ``uint8 [H, W, 3]`` arrays (for a detector whose ``image_arrays`` says it takes them)."""
    if part.captions is not None:  # a bench: per sentence, its rows (ScoreJob.validate refuses another unit)
        bench_dir = Path(part.source.rsplit("#", 1)[0]).parent
        last: tuple[str, object] | None = None  # (image path, decoded image): consecutive captions share it
        for rows in part.captions:
            first = rows[0]
            image = None
            if decode and last is not None and last[0] == first.image:
                image = last[1]
            elif decode:
                try:
                    image = load_image_file(bench_dir / first.image, first.id, draft=draft)
                except ImageDecodeError as e:
                    for r in rows:
                        skipped.add(r.id, f"image {first.image}: {e.reason}", e.kind)
                    continue
                last = (first.image, image)
            yield bench_items(rows, image)
        return
    for sample in read_shard(part.source, skipped, decode=decode, draft=draft, arrays=arrays):
        yield sample_items(sample, unit)


def batches(groups: Iterator[list[Item]], batch_size: int) -> Iterator[list[Item]]:
    """Pack whole captions into batches of at most ``batch_size`` items (a longer caption is one batch)."""
    batch: list[Item] = []
    for g in groups:
        if batch and len(batch) + len(g) > batch_size:
            yield batch
            batch = []
        batch.extend(g)
    if batch:
        yield batch


# ---------------------------------------------------------------------------------------------- scoring
def source_fingerprint(part: Part, full: bool = False) -> dict:
    """What a part was made from: its shard's content fingerprint (sampled blocks; whole with ``full``), or the bench
    file's plus the chunk number."""
    if part.captions is not None:
        path, chunk = part.source.rsplit("#", 1)
        return {"bench": path_fingerprint(path), "chunk": int(chunk)}
    return file_fingerprint(part.source, full=full)


def part_fingerprints(parts: Sequence[Part], detector_fp: str, full: bool = False) -> dict[str, dict]:
    """Part name -> what its scores must have been made from: its :func:`source_fingerprint` and the detector's
    ``detector_fp`` (:func:`~halsift.corpus.fingerprint.spec_fingerprint`), as ``score_part`` records them."""
    return {p.name: {"source_fp": source_fingerprint(p, full), "detector_fp": detector_fp} for p in parts}


def _footer_matches(path: Path, fps: dict) -> bool:
    """A part written before run-folder records: reused when its footer names the same input and detector."""
    try:
        stats = part_stats(path)
    except (OSError, ValueError):  # pyarrow.ArrowInvalid is a ValueError: a damaged part is rescored
        return False
    return all(stats.get(k) == v for k, v in fps.items())


def reusable(out: Path, name: str, fps: dict) -> bool:
    """A finished part may be reused only if it was scored from the same input by the same detector (``fps``: its
    :func:`part_fingerprints` entry) and still holds what was written (:func:`~halsift.execution.run_folder.part_reusable`:
    a part altered since is rescored). A part of an older folder, without a record, is judged by its footer."""
    return part_reusable(out, name, fps, legacy=lambda p: _footer_matches(p, fps))


class Counted:
    """Iterate ``it`` and count its items (a part's caption groups: its samples)."""

    def __init__(self, it) -> None:
        self.it, self.count = iter(it), 0

    def __iter__(self):
        return self

    def __next__(self):
        x = next(self.it)
        self.count += 1
        return x


class PartRows:
    """The scored rows of one part, accumulated batch by batch, then written as one parquet part whose schema
    metadata carries the part's stats (what :func:`part_stats` reads). Every batch of results passes ``guard``
    (:class:`~halsift.filtering.scoring.guard.ScoreGuard`: no non-finite score, a parse-failure limit) first."""

    def __init__(self, detector: Detector, guard: ScoreGuard | None = None) -> None:
        self.detector = detector
        self.guard = guard if guard is not None else ScoreGuard(detector.name)
        self.cols: dict[str, list] = {"key": [], "sentence_index": [], "score": [], "parsed": [], "captioner": []}
        self.spans: list = []
        self.t_model = 0.0
        self.decode: dict[str, int] = {}  # the detector's image decode counts (decode=gpu), summed over batches

    def add(self, rows: Sequence[tuple[str, int, str]], results: Sequence) -> None:
        """``rows``: (key, sentence_index, captioner) of each scored item, in order; ``results`` the detector's."""
        if len(results) != len(rows):
            raise RuntimeError(f"detector {self.detector.name} returned {len(results)} results for {len(rows)} items")
        for k, n in self.detector.take_decode_counts().items():
            self.decode[k] = self.decode.get(k, 0) + n
        scores = [float(r.score) for r in results]
        self.guard.check(rows, scores, [bool(r.parsed) for r in results])  # before the clip below hides a NaN
        for (key, index, captioner), r, score_ in zip(rows, results, scores):
            self.cols["key"].append(key)
            self.cols["sentence_index"].append(index)
            self.cols["score"].append(min(100.0, max(0.0, score_)))
            self.cols["parsed"].append(bool(r.parsed))
            self.cols["captioner"].append(captioner)
            self.spans.append(r.spans or [])

    def write(self, out_path: Path, part: Part, rank: int, world: int, samples: int, skipped: dict, wall: float,
              decode_s: float, fingerprints: dict | None) -> dict:
        """Write the part atomically with its stats in the metadata; returns the stats. ``wall``: seconds from
        the part's start; ``decode_s``: the input pipeline's busy time for it; ``skipped``: a SkipCounter's JSON."""
        c = self.cols
        extra = {"captioner": c["captioner"], **({"spans": self.spans} if self.detector.localizes else {})}
        table = scores_table(c["key"], c["sentence_index"], c["score"], c["parsed"], self.detector.name, extra)
        stats = {"part": part.name, "source": part.source, "samples": samples,
                 "sentences": len(c["key"]), "parse_failures": c["parsed"].count(False), "skipped": skipped,
                 **(fingerprints or {}), **({"image_decode": self.decode} if self.decode else {})}
        run = {"rank": rank, "world_size": world, "time_model_s": round(self.t_model, 4),
               "time_data_s": round(wall - self.t_model, 4), "time_decode_s": round(decode_s, 4),
               "wall_s": round(wall, 4)}
        forget_part(out_path.parent, out_path.name)
        write_part_atomic(table.replace_schema_metadata({PART_META_KEY: json.dumps(stats).encode()}), out_path)
        if fingerprints:
            part_done(out_path.parent, out_path.name, fingerprints, run)
        return {**stats, **run}


def item_rows(batch: Sequence[Item]) -> list[tuple[str, int, str]]:
    """What a part records of each scored item besides its result: (key, sentence_index, captioner)."""
    return [(it.key, it.sentence_index, it.meta.get("captioner", "")) for it in batch]


def score_part(detector: Detector, part: Part, out_path: Path, unit: str, batch_size: int, bar=None,
               rank: int = 0, world: int = 1, fingerprints: dict | None = None,
               guard: ScoreGuard | None = None) -> dict:
    """Score one part and write it atomically; returns its stats (also stored in the parquet metadata). ``guard``:
    the process's :class:`~halsift.filtering.scoring.guard.ScoreGuard` (default: a fresh one)."""
    t0 = time.perf_counter()
    skipped = SkipCounter(max_examples=1000)
    rows = PartRows(detector, guard)
    # Images are decoded even for detectors that ignore them, so every detector skips the same samples.
    groups = Counted(iter_caption_groups(part, unit, skipped, draft=detector.decode_size,
                                         arrays=detector.image_arrays))

    def prepared(batches):  # the detector's CPU half (preprocess, tokenize) runs in the reader thread too
        for b in batches:
            yield b, detector.prepare(b)

    # tar reading, decoding and preprocessing run one batch ahead of the model, in a thread
    reader = Prefetcher(prepared(batches(groups, batch_size)), depth=2)
    for batch, prep in reader:
        tm = time.perf_counter()
        results = detector.score_batch(batch) if prep is None else detector.score_prepared(batch, prep)
        rows.t_model += time.perf_counter() - tm
        rows.add(item_rows(batch), results)
        if bar is not None:
            bar.update(len(batch))
    return rows.write(out_path, part, rank, world, groups.count, skipped.to_json(), time.perf_counter() - t0,
                      reader.busy_s, fingerprints)


def part_footer(path: Path) -> dict:
    """What a finished part carries in its parquet metadata: what it was made from and its counts (never how a run
    made it, so that the same inputs give the same bytes whichever engine, rank or run made them)."""
    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta.get(PART_META_KEY, b"{}"))


def part_stats(path: Path) -> dict:
    """A finished part's stats: its footer (:func:`part_footer`) and how the run that made it went (rank, world size,
    timings: its record's ``run``; a part written before records carries them in its footer)."""
    from halsift.execution.run_folder import part_record as record

    return {**part_footer(path), **((record(path.parent, path.name) or {}).get("run") or {})}


@dataclass
class Run:
    """A started score run: its detector, folder, parts, identity (the manifest's) and how parts are fingerprinted."""

    detector: Detector
    out: Path
    parts: list[Part]
    ident: dict
    full_hash: bool = False

    @property
    def detector_fp(self) -> str:
        return self.ident["detector_fp"]

    def fps(self, parts: Sequence[Part] | None = None) -> dict[str, dict]:
        """:func:`part_fingerprints` of ``parts`` (default: every part)."""
        return part_fingerprints(self.parts if parts is None else parts, self.detector_fp, self.full_hash)


def stored_embeddings(detector: Detector) -> list[Path]:
    """The ``halsift embed`` folders a detector (or any member of an ensemble) reads its vectors from."""
    lookup = getattr(detector, "lookup", None)
    found = [Path(lookup.folder)] if lookup is not None else []
    for m in getattr(detector, "members", None) or ():
        found += stored_embeddings(m)
    return found


def start_run(job, state) -> Run:
    """The start every engine shares: load ``job``'s detector,
    plan the parts, check that stored embeddings were made from these shards' content
    (:func:`~halsift.corpus.embedding_store.check_embedded_from`), then check or start the folder
    (:func:`check_or_start`). ``job``: a :class:`~halsift.filtering.scoring.job.ScoreJob`, passed whole; ``state``: its :class:`~halsift.execution.job.Place`."""
    from halsift.corpus.embedding_store import check_embedded_from
    from halsift.filtering.detectors.spec import load_detector

    detector = load_detector(job.spec())
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    parts, inputs = plan_parts(job.data)
    shards = [Path(p.source) for p in parts if p.captions is None]
    for folder in stored_embeddings(detector):
        check_embedded_from(folder, shards)
    ident = {"detector": movable(detector.spec, job), "detector_name": movable(detector.name, job), "unit": job.unit,
             "inputs": inputs, "detector_fp": spec_fingerprint(detector.fingerprint_spec()),
             "settings": job.settings(), "run_settings": job.run_settings(),
             **({"role": job.role} if getattr(job, "role", "") else {})}
    check_or_start(out, ident, state)
    return Run(detector, out, parts, ident, job.full_hash)


def movable(spec: str, job) -> str:
    """``spec`` as an identity records it: the path of the pipeline folder the job's folder lies in (``job.root``, a
    cascade's --out) written ``{root}``, so that no absolute path of that folder enters its identity (a copied or
    moved cascade folder is the same run)."""
    root = getattr(job, "root", "")
    return spec.replace(str(Path(root).resolve()), "{root}") if root else spec


IDENTITY = ("detector", "inputs")  # compared as they are; ``settings`` (the unit) by run_folder.settings_diff


def check_or_start(out: Path, ident: dict, state) -> None:
    """Refuse to mix runs (:func:`halsift.execution.run_folder.check_or_start`, one line naming the key); write the
    'running' manifest on rank 0."""
    # an older manifest has its unit beside the detector, not under "settings"
    check_folder(out, ident, keys=IDENTITY, what="scores", error=RunMismatch, start=False,
                 defaults=lambda old: {"unit": old.get("unit", "sentence")})
    state.wait_for_everyone()
    if state.is_main_process:  # "running" until every part is checked or rescored: select refuses it meanwhile
        write_json_atomic(out / MANIFEST, {**ident, "status": "running"})
    state.wait_for_everyone()


def finish_manifest(out: Path, ident: dict, parts: list[Part], wall: float, scored_now: int,
                     resumed: int, world: int, t_scoring: float | None = None,
                     max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES, extra: dict | None = None) -> dict:
    """Aggregate the parts' own stats into ``_manifest.json`` (rank 0, after all parts exist); ``extra``: more
    entries of the run (e.g. ``torch_threads``, :mod:`.threads`). A folder that fails
    :func:`~halsift.filtering.scoring.guard.final_check` (nothing scored, too many parse failures) is written with
    ``status: failed`` and its ``error``, then :class:`ScoreError` is raised."""
    stats = [part_stats(out / p.name) for p in parts]
    skipped = SkipCounter(max_examples=10_000)
    for s in stats:
        skipped.merge(SkipCounter.from_json(s["skipped"]))
    sentences = sum(s["sentences"] for s in stats)
    decode: dict[str, int] = {}
    for s in stats:
        for k, n in s.get("image_decode", {}).items():
            decode[k] = decode.get(k, 0) + n
    t_model = sum(s.get("time_model_s", 0.0) for s in stats)
    t_data = sum(s.get("time_data_s", 0.0) for s in stats)
    manifest = {
        **ident, "status": "complete", "parts": len(parts), "part_files": [p.name for p in parts],
        # size, content hash and repeated rows of each part: select refuses a part altered or swapped since
        RECORDS: {p.name: part_record(out / p.name) for p in parts},
        "parts_resumed": resumed,
        "world_size": world, "ranks": sorted({s["rank"] for s in stats if "rank" in s}),
        "part_world_sizes": sorted({s["world_size"] for s in stats if "world_size" in s}),
        "samples": sum(s["samples"] for s in stats), "sentences": sentences,
        "parse_failures": sum(s["parse_failures"] for s in stats),
        "skipped": skipped.to_json(), "wall_time_s": round(wall, 3),
        "sentences_scored_this_run": scored_now,
        "scoring_time_s": round(t_scoring if t_scoring is not None else wall, 3),
        # throughput of this invocation's scoring loop (model loading excluded), all ranks together
        "sentences_per_s": round(scored_now / (t_scoring or wall), 2) if (t_scoring or wall) > 0 else None,
        # of the scoring loop's wall time: in the detector (its forward, plus its preprocessing and tokenization
        # when it has no prepare step) vs waiting for input and writing; "decode" is the reader thread's busy
        # time (tar, image decoding, the detector's prepare step), which overlaps the model; in % (0–100)
        "time_share": {"model": percent(t_model / max(t_model + t_data, 1e-9), 2),
                       "data": percent(t_data / max(t_model + t_data, 1e-9), 2),
                       "decode": percent(sum(s.get("time_decode_s", 0.0) for s in stats)
                                         / max(t_model + t_data, 1e-9), 2)},
        # decode=gpu: images decoded on the device, on the host (not plain JPEGs), on the host after the device
        # decoder refused them (fallback), and by neither (unreadable: their sentences count as parse failures)
        **({"image_decode": decode} if decode else {}),
        **(extra or {}),
    }
    error = final_check(ident.get("detector_name", ident["detector"]), sentences, manifest["parse_failures"],
                        manifest["skipped"], max_parse_failures)
    shards = all(getattr(p, "captions", None) is None for p in parts)  # a bench's parts split its captions
    twice = repeated_key([out / p.name for p in parts]) if shards and not error else None
    if twice:  # the duplicate-key rule of every stage that reads shards (select refuses such a folder too)
        error = key_in_two_inputs(twice[0], parts[twice[1]].source, parts[twice[2]].source, "score")
    if error:
        manifest.update(status="failed", error=error)
    write_json_atomic(out / MANIFEST, manifest)
    if error:
        raise ScoreError(f"{out}: {error}")
    return manifest
