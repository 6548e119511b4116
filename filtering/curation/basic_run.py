"""``halsift basic``: the basic-filter fields of every sample, one parquet part per input, resumable per part.

Inputs: shards (halsift's or img2dataset's ``webdataset`` layout: sizes from the json's recorded size when it has
one, else the image header), or parquet tables of captions (img2dataset's per-shard ``.parquet``, DataComp's
metadata): a key column (``key``, else ``uid``), a caption column (``caption``, else ``text``) and the sizes
(``original_width``/``original_height``, else ``width``/``height``), read in record batches, no image decoded.

Output folder: ``part-<input>.parquet`` per input (:data:`~halsift.filtering.curation.basic.FIELDS` plus
``pass_<preset>``; written atomically, so a killed run resumes at the first missing part; a part is reused only when
its input has the content it was made from and the part is unaltered, :mod:`halsift.execution.run_folder`; parts of
older folders, without a record, are made again), ``_basic.json`` (the settings: a rerun with other settings is
refused) and ``manifest.json`` (counts per rule, merged from the parts' own counts, which each part keeps in its
parquet metadata; ``running`` until done, ``failed`` with the reason when an error stopped it: nothing read at all,
or a key found in two inputs, :func:`~halsift.corpus.sample.key_in_two_inputs`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from halsift.corpus.errors import InputError
from halsift.corpus.fingerprint import file_fingerprint
from halsift.corpus.images import SkipCounter
from halsift.execution.run_folder import check_or_start, failing, forget_part, part_done, part_reusable
from halsift.corpus.sample import key_in_two_inputs, nothing_read, repeated_key
from halsift.corpus.scores import part_name, write_part_atomic
from halsift.corpus.shards import ShardFormatError, expand_shards, iter_shard, write_json_atomic
from halsift.filtering.curation.basic import PRESETS, apply_presets, fields_table, header_size, merge_counts, \
    recorded_size

SETTINGS = "_basic.json"
META_KEY = b"halsift_basic"
BATCH = 1024
KEY_COLUMNS = ("key", "uid")
CAPTION_COLUMNS = ("caption", "text")
SIZE_COLUMNS = (("original_width", "original_height"), ("width", "height"))


class BasicError(InputError):
    """Bad ``halsift basic`` input or output folder (one line naming it)."""


def inputs_of(data: str) -> tuple[str, list[Path]]:
    """``("table", parquet files)`` for a .parquet file / glob / folder of parquet without shards, else
    ``("shards", tars)``."""
    p = Path(data)
    if p.suffix == ".parquet" or (p.is_dir() and not any(p.glob("*.tar")) and any(p.glob("*.parquet"))):
        files = sorted(p.glob("*.parquet")) if p.is_dir() else sorted(Path(x) for x in glob.glob(data))
        if not files:
            raise BasicError(f"data: no parquet table matches {data}")
        return "table", files
    return "shards", expand_shards(data)


def _pick(names: list[str], options: tuple, path: Path, what: str) -> str:
    found = next((c for c in options if c in names), None)
    if found is None:
        raise BasicError(f"data: {path} has no {what} column (expected one of {', '.join(options)}; "
                         f"it has {', '.join(names)})")
    return found


def _table_batches(path: Path, skipped: SkipCounter, row_group: int | None = None, earlier: frozenset = frozenset()
                   ) -> Iterator[tuple[list[str], list[str], list[tuple[int, int] | None], str]]:
    """(keys, captions, sizes, size source) per record batch of a parquet table (of its row group ``row_group``,
    else all of it). Size columns must hold numbers (one line naming the file and column otherwise, before any row
    is read); a key repeated in the table is counted as ``duplicate`` and its first row kept: the shards' rule
    (:func:`~halsift.corpus.shards.iter_shard`). ``earlier``: the keys of this row group that an earlier one holds
    (:func:`_repeated_in_groups`)."""
    try:
        f = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise BasicError(f"data: {path} is not a readable parquet table ({e})") from None
    names = f.schema_arrow.names
    key, cap = _pick(names, KEY_COLUMNS, path, "key"), _pick(names, CAPTION_COLUMNS, path, "caption")
    size = next((pair for pair in SIZE_COLUMNS if set(pair) <= set(names)), None)
    if size is None:
        raise BasicError(f"data: {path} has no size columns (expected original_width/original_height or "
                         "width/height); give the shards instead to read sizes from the image headers")
    for col in size:
        t = f.schema_arrow.field(col).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t)):
            raise BasicError(f"data: {path}: the size column {col!r} holds {t}; expected numbers (pixels)")
    seen: set[str] = set(earlier)
    groups = None if row_group is None else [row_group]
    for b in f.iter_batches(batch_size=BATCH, columns=[key, cap, *size], row_groups=groups):
        ws, hs = b.column(size[0]).to_pylist(), b.column(size[1]).to_pylist()
        keys, caps, sizes = [], [], []
        for k, c, w, h in zip(b.column(key).to_pylist(), b.column(cap).to_pylist(), ws, hs):
            k = str(k)
            if k in seen:
                skipped.add(k, "the key repeats an earlier row of the table (the first is kept)", "duplicate")
                continue
            seen.add(k)
            keys.append(k)
            caps.append(c or "")
            sizes.append((int(w), int(h)) if _positive(w) and _positive(h) else None)
        yield keys, caps, sizes, size[0]


def _positive(v) -> bool:
    """A usable size: a finite number > 0 (NaN and infinities are missing)."""
    return v is not None and v == v and 0 < v < float("inf")


def _repeated_in_groups(f: pq.ParquetFile, path: Path) -> list[frozenset]:
    """Per row group, its keys that an earlier row group holds (so that parts made apart skip the rows one pass
    over the table skips). Reads the key column only."""
    key = _pick(f.schema_arrow.names, KEY_COLUMNS, path, "key")
    seen: set[str] = set()
    out = []
    for g in range(f.metadata.num_row_groups):
        keys = [str(k) for k in f.read_row_group(g, columns=[key]).column(0).to_pylist()]
        out.append(frozenset(k for k in keys if k in seen))
        seen.update(keys)
    return out


def _shard_batches(path: Path, skipped: SkipCounter, size_from: str):
    """(keys, captions, sizes, size sources) per batch of a shard's samples."""
    keys, caps, sizes, srcs = [], [], [], []
    for s in iter_shard(path, skipped):
        size = recorded_size(s.meta) if size_from == "auto" else None
        src = "recorded" if size else "header"
        if size is None:
            size = header_size(s.image)
            if size is None:
                skipped.add(s.key, "no image, or its header is unreadable: sizes left null", "image_unreadable")
                src = "none"
        keys.append(s.key)
        caps.append(s.caption)
        sizes.append(size)
        srcs.append(src)
        if len(keys) == BATCH:
            yield keys, caps, sizes, srcs
            keys, caps, sizes, srcs = [], [], [], []
    if keys:
        yield keys, caps, sizes, srcs


def _one_part(kind: str, path: Path, dest: Path, detector, presets: list[str], size_from: str, bar,
              row_group: int | None = None, earlier: frozenset = frozenset()) -> dict:
    """Compute and write one input's part (of a table: its row group ``row_group``, else all of it); returns its
    counts (also stored in the part's metadata)."""
    skipped = SkipCounter(max_examples=20)
    tables, langs, size_src = [], Counter(), Counter()
    corrupt = None
    batches = _table_batches(path, skipped, row_group, earlier) if kind == "table" \
        else _shard_batches(path, skipped, size_from)
    try:
        for keys, caps, sizes, src in batches:
            detected = detector.detect(caps)
            langs.update(lang for lang, _ in detected)
            size_src.update([src] * len(keys) if isinstance(src, str) else src)
            tables.append(fields_table(keys, detected, caps, sizes))
            bar.update(len(keys))
    except ShardFormatError as e:  # the samples read before the damage are kept
        corrupt = str(e)
        skipped.add(path.name, str(e), "corrupt_shard", n=e.lost or 1)
    t = pa.concat_tables(tables) if tables else fields_table([], [], [], [])
    t, counts = apply_presets(t, presets)
    info = {"input": str(path), "row_group": row_group, "rows": len(t), "presets": counts, "lang": dict(langs),
            "size_source": dict(size_src),
            "skipped": skipped.to_json(), "corrupt": corrupt}
    t = t.replace_schema_metadata({META_KEY: json.dumps(info).encode()})
    write_part_atomic(t, dest)
    return info


def run_basic(data: str, out: str | os.PathLike, *, presets: list[str], detector, size_from: str = "auto",
              show_progress: bool = True, engine: str = "local", **flags) -> dict:
    """Write the field parts of every input in ``data`` to ``out`` (finished parts are kept) and the manifest. The
    parts are a job of the execution layer (:class:`~halsift.execution.stage_job.StageJob`) on ``engine`` with its ``flags``
    (``num_tasks``, ``task_index``, ``claim_timeout``, ``address``, ``workers``); a parquet table with several row
    groups gives one part per row group. Returns the manifest (``status: running`` from a task that left parts to
    others, with the engine's ``lines``)."""
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        raise BasicError(f"preset: {unknown[0]!r} is not a preset (known: {', '.join(PRESETS)})")
    kind, inputs = inputs_of(data)
    out = Path(out)
    names = [part_name(0, p.name.removesuffix(".parquet")) for p in inputs]
    if len(set(names)) != len(names):
        raise BasicError(f"data: two inputs share the name {next(n for n in names if names.count(n) > 1)}")
    settings = {"data": [str(p.resolve()) for p in inputs], "kind": kind, "presets": presets,
                "size_from": size_from, "language": detector.settings}
    from halsift.execution.engines import resolve_engine
    from halsift.execution.stage_job import StageJob

    job = StageJob("basic", out, [], _make_part, _part_done, honours=_HONOURS, why_not=_WHY_NOT,
                   manifest="manifest.json", show_progress=show_progress, **flags)
    e = resolve_engine(engine, job)
    e.check(job)  # a refused flag before the folder is touched
    _open_out(out, settings)
    with failing(out, "manifest.json"):
        t0 = time.perf_counter()
        parts = _plan(kind, inputs, names, out, detector, presets, size_from)
        job = dataclasses.replace(job, parts=parts)
        summary = e.execute(job)  # the engine says what was done before and what it made (never a second check)
        made = set(summary.run.get("made", ()))
        if not summary.complete:
            return {"status": "running", "settings": settings, "lines": summary.lines, "parts": [p.name for p in parts],
                    "parts_done_before": summary.run["parts_skipped_done"]}
        wall = time.perf_counter() - t0
        infos = [json.loads(pq.read_schema(out / p.name).metadata[META_KEY]) for p in parts]
        done_before = summary.run["parts_skipped_done"]
        rows_now = sum(i["rows"] for i, p in zip(infos, parts) if p.name in made)
        manifest = _manifest(infos, settings, [p.name for p in parts])
        empty = nothing_read(manifest["samples"], manifest["skipped"], "read")
        if empty:  # the one empty-input rule (0-byte or empty inputs); the parts stay, the manifest is not written
            raise BasicError(f"data: {empty}")
        twice = repeated_key([out / p.name for p in parts])
        if twice:  # the one duplicate-key rule: a key names one sample (within an input the first is kept)
            raise BasicError(key_in_two_inputs(twice[0], str(parts[twice[1]].args[1]), str(parts[twice[2]].args[1]),
                                               "data"))
        manifest.update(parts_done_before=done_before, wall_time_s=round(wall, 3), lines=summary.lines,
                        samples_per_s=round(rows_now / wall, 1) if wall > 0 and rows_now else None)
        write_json_atomic(out / "manifest.json", manifest)
        return manifest


_HONOURS = frozenset({"num_tasks", "task_index", "claim_timeout", "address", "workers"})
_WHY_NOT = {"decode_workers": "decodes no image (sizes come from the recorded size or the image header)"}


def _plan(kind: str, inputs: list[Path], names: list[str], out: Path, detector, presets: list[str],
          size_from: str) -> list:
    """The parts: one per shard, or per row group of a parquet table with several (``part-<table>.rgNNNNN``)."""
    from halsift.execution.stage_job import StagePart

    parts = []
    for path, name in zip(inputs, names):
        fp = file_fingerprint(path)
        groups, earlier = [None], [frozenset()]
        if kind == "table":
            try:
                f = pq.ParquetFile(path)
            except (pa.ArrowInvalid, OSError) as e:
                raise BasicError(f"data: {path} is not a readable parquet table ({e})") from None
            if f.metadata.num_row_groups > 1:
                groups, earlier = list(range(f.metadata.num_row_groups)), _repeated_in_groups(f, path)
        for g, before in zip(groups, earlier):
            made = {"source_fp": fp} if g is None else {"source_fp": fp, "row_group": g}
            pname = name if g is None else part_name(0, f"{path.name.removesuffix('.parquet')}.rg{g:05d}")
            parts.append(StagePart(pname, (kind, path, g, out, made, detector, tuple(presets), size_from, before)))
    return parts


def _part_done(part) -> bool:
    kind, path, g, out, made, *_ = part.args
    return part_reusable(out, part.name, made)


def _make_part(part) -> dict:
    kind, path, g, out, made, detector, presets, size_from, earlier = part.args
    forget_part(out, part.name)
    info = _one_part(kind, path, out / part.name, detector, list(presets), size_from, _NoBar(), g, earlier)
    part_done(out, part.name, made)
    return info


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


def _open_out(out: Path, settings: dict) -> None:
    """The folder's identity (:func:`halsift.execution.run_folder.check_or_start`): ``_basic.json`` holds the settings
    (an older, flat one is read as they are); another run's folder, or one holding anything else, is refused."""
    state = out / SETTINGS
    if not state.exists() and out.exists() and any(not p.name.startswith(".") for p in out.iterdir()):  # .lock
        raise BasicError(f"out: {out} is not empty and holds no basic fields; choose a new folder")
    old = check_or_start(out, {"settings": settings}, keys=(), what="basic fields", manifest=SETTINGS,
                         error=BasicError, defaults=lambda old: old, parts_glob="", start=False,
                         hint="choose a new folder", prefix="out: ")
    if old is None:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(state, {"settings": settings})
    write_json_atomic(out / "manifest.json", {"status": "running", "settings": settings})


def _manifest(parts: list[dict], settings: dict, names: list[str]) -> dict:
    counts: dict = {}
    langs, src, skipped = Counter(), Counter(), SkipCounter(max_examples=20)
    for p in parts:
        merge_counts(counts, p["presets"])
        langs.update(p["lang"])
        src.update(p["size_source"])
        skipped.merge(SkipCounter.from_json(p["skipped"]))
    rules = {name: [{"rule": r.name, "text": r.text()} for r in PRESETS[name]] for name in settings["presets"]}
    return {"status": "complete", "settings": settings, "parts": names, "samples": sum(p["rows"] for p in parts),
            "presets": counts, "rules": rules, "lang": dict(langs.most_common(20)), "size_source": dict(src),
            "skipped": skipped.to_json(), "corrupt_inputs": [p["corrupt"] for p in parts if p["corrupt"]]}
