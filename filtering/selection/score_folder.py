"""The one check of a score folder before selection, shared by the in-memory and the out-of-core (resumable) select.

:func:`check_score_folder` reads only the folder's ``_manifest.json`` and each part's parquet footer (schema and
column statistics; a part's ``detector`` / ``sentence_index`` columns are read only when its footer has no
statistics), so it costs the same for 10 thousand or 100 million rows. It raises :class:`SelectError` (one line,
naming the folder or the part) when

- the manifest is missing, not JSON, or does not say ``complete`` (a killed ``halsift score``, or score tasks
  still running: their claims are counted), unless ``allow_partial``;
- a part the manifest lists is missing, or a part is there that it does not list (a foreign part);
- a part is not readable parquet, lacks a score column, or holds a column of another kind (a string ``score``:
  :func:`halsift.corpus.scores.check_column_types`);
- the parts hold more than one detector, or another detector than the manifest's (without ``detector``), or no part
  holds the chosen ``detector``;
- a sentence index is below -1;
- a part differs from the size and content hash the score manifest records for it (``part_records``, written by
  ``halsift score``: a part altered, swapped or replaced after scoring); a manifest without records (made before
  them) is not checked, and the selection's manifest counts its parts as unrecorded.

:func:`check_sources` then pairs each input shard with its part (``part-<shard>.parquet``) and refuses a shard whose
size or content hash differs from the fingerprint the part records (shards replaced at the same paths, or parts
swapped). :func:`check_repeated_rows` finds a (key, sentence_index) row repeated within a part, reading only the parts
whose record does not vouch for them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from halsift.corpus.errors import InputError
from halsift.corpus.fingerprint import file_fingerprint, refingerprint
from halsift.execution.claims import CLAIMS  # live score tasks' claims
from halsift.execution.run_folder import read_record
from halsift.corpus.scores import ScoresFormatError, check_column_types, part_name
from halsift.filtering.detectors.base import CAPTION_INDEX
from halsift.filtering.scoring.part_records import PART_META_KEY, RECORDS, content as _content, matches

SCORE_MANIFEST = "_manifest.json"  # written by halsift.filtering.scoring.runner
REQUIRED = ("key", "sentence_index", "score", "detector")


class SelectError(InputError):
    """Bad selection arguments or inputs (names the argument and what was expected)."""


class SelectionMismatch(SelectError):
    """An output folder that holds another selection (other arguments, or made from other scores or shards)."""


@dataclass
class ScoreFolder:
    """A checked score folder (or single parquet file)."""

    path: Path
    parts: list[Path]
    manifest: dict
    status: str | None
    detector: str | None  # the chosen one, else the manifest's, else the one the parts hold
    other_detectors: bool = False  # some parts also hold rows of detectors other than the chosen one
    fingerprints: dict[str, dict] = field(default_factory=dict)  # part name -> {size, hash} as found now
    vouched: set[str] = field(default_factory=set)  # parts whose record matches and has no repeated row

    def info(self, allow_partial: bool) -> dict:
        """The ``source`` fields a selection's manifest records."""
        return {"parts": [str(p) for p in self.parts], "manifest_status": self.status,
                "allow_partial": allow_partial, "detector": self.detector}

    def digest(self) -> str:
        """One hex digest of every part's name, size and content hash: the scores a selection was made from."""
        items = sorted((name, fp["size"], fp["hash"]) for name, fp in self.fingerprints.items())
        return hashlib.blake2b(json.dumps(items).encode(), digest_size=16).hexdigest()


def _read_manifest(path: Path) -> dict | None:
    return read_record(path, SelectError, "scores: ", "rescore into a new folder")


def _unfinished_claims(folder: Path) -> int:
    """How many parts score tasks have claimed but not written yet."""
    claims = folder / CLAIMS
    if not claims.is_dir():
        return 0
    parts = {p.name.rsplit(".", 1)[0] for p in claims.iterdir() if p.name.rsplit(".", 1)[-1].isdigit()}
    return sum(not (folder / p).exists() for p in parts)


def _status(folder: Path, manifest: dict | None, path: Path, allow_partial: bool) -> str | None:
    status = None if manifest is None else manifest.get("status", "complete" if manifest.get("complete") else None)
    if status == "complete" or allow_partial:
        return status
    where = folder / SCORE_MANIFEST if path.is_dir() else path
    if manifest is None:
        what = "is missing (parts made elsewhere, or a `halsift score` killed before its first part)"
    elif manifest.get("error"):  # a finished run that failed its end check (halsift.filtering.scoring.guard)
        what = f"says status {status!r} ({str(manifest['error'])[:300]})"
    else:
        claimed = _unfinished_claims(folder)
        what = f"says status {status!r}" + (f" (score tasks still hold {claimed} unwritten part(s))" if claimed else
                                             " (a killed or unfinished `halsift score`)")
    raise SelectError(f"scores: {where}: the score manifest {what}; rerun or finish the score command, or pass "
                      "--allow-partial to select from the parts that exist")


def _column_values(meta: pq.FileMetaData, column: str) -> tuple[object, object] | None:
    """(min, max) of ``column`` over the part from its footer statistics; ``None`` when some row group has none."""
    idx = meta.schema.names.index(column)
    lo = hi = None
    for rg in range(meta.num_row_groups):
        st = meta.row_group(rg).column(idx).statistics
        if meta.row_group(rg).num_rows == 0:
            continue
        if st is None or not st.has_min_max:
            return None
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
    return lo, hi


def part_detectors(p: Path, meta: pq.FileMetaData) -> list[str]:
    """The detectors one part holds (footer statistics when one; else the column, read dictionary-encoded)."""
    if meta.num_rows == 0:
        return []
    mm = _column_values(meta, "detector")
    if mm is not None and mm[0] == mm[1]:
        return [mm[0].decode() if isinstance(mm[0], bytes) else str(mm[0])]
    col = pq.read_table(p, columns=["detector"], read_dictionary=["detector"])["detector"]
    return sorted(pc.unique(col.cast(pa.string())).to_pylist())


def _min_sentence_index(p: Path, meta: pq.FileMetaData) -> int | None:
    if meta.num_rows == 0:
        return None
    mm = _column_values(meta, "sentence_index")
    if mm is not None:
        return int(mm[0])
    return pc.min(pq.read_table(p, columns=["sentence_index"])["sentence_index"]).as_py()


def _footer(p: Path) -> pq.FileMetaData:
    try:
        meta = pq.ParquetFile(p).metadata
    except (pa.ArrowInvalid, OSError) as e:
        raise SelectError(f"scores: {p} is not a readable parquet file ({e}); rescore it (delete it and rerun the "
                          "score command)") from None
    missing = [c for c in REQUIRED if c not in meta.schema.names]
    if missing:
        raise SelectError(f"scores: {p} lacks column(s) {missing}; expected {list(REQUIRED)}")
    try:
        check_column_types(p, meta.schema.to_arrow_schema())
    except ScoresFormatError as e:
        raise SelectError(str(e)) from None
    return meta


def _listed(folder: Path, parts: list[Path], manifest: dict | None) -> None:
    listed = (manifest or {}).get("part_files")
    if listed is None:
        return
    extra = [p for p in parts if p.name not in listed]
    if extra:
        raise SelectError(f"scores: {extra[0]} is not a part that {SCORE_MANIFEST} lists (a foreign part?); "
                          "remove it or score again into a new folder")
    gone = [name for name in listed if not (folder / name).is_file()]
    if gone:
        raise SelectError(f"scores: {folder / gone[0]} is listed in {SCORE_MANIFEST} but missing ({len(gone)} "
                          "listed part(s) missing); rerun the score command to score it again")


def check_score_folder(scores: str | os.PathLike, detector: str | None = None,
                       allow_partial: bool = False) -> ScoreFolder:
    """Check a score folder (or one parquet file) for selection (see the module docstring); raises
    :class:`SelectError` naming the folder or part, or :class:`FileNotFoundError` when ``scores`` does not exist."""
    path = Path(scores)
    if path.is_dir():
        folder = path
        parts = sorted(p for p in path.glob("*.parquet") if not p.name.startswith("."))
    elif path.is_file():
        folder, parts = path.parent, [path]
    else:
        raise FileNotFoundError(f"scores: {path} does not exist")
    manifest = _read_manifest(folder / SCORE_MANIFEST) if path.is_dir() else None
    if manifest is not None and manifest.get("role"):  # a pipeline's own stage: placeholders beside real scores
        raise SelectError(f"scores: {folder} is a {manifest['role']} folder (its scores are the pipeline's "
                          f"internals, placeholders included), not a score folder of the corpus; give the folder "
                          f"that holds it ({folder.parent.parent})")
    if parts or manifest is not None:  # a folder with neither is no score folder: say so below
        status = _status(folder, manifest, path, allow_partial)
    if path.is_dir():
        _listed(folder, parts, manifest)
    if not parts:
        raise SelectError(f"scores: {path} holds no .parquet parts")
    expected = detector or (manifest or {}).get("detector_name")
    seen: dict[str, Path] = {}
    other, chosen_found = False, False
    for p in parts:
        meta = _footer(p)
        dets = part_detectors(p, meta)
        if detector is not None:
            chosen_found |= detector in dets
            other |= any(d != detector for d in dets)
        elif expected is not None and any(d != expected for d in dets):
            raise SelectError(f"scores: {p} holds scores of detector {[d for d in dets if d != expected][0]!r} but "
                              f"the folder is {expected!r} (a foreign part?); remove it, or choose one with --detector")
        for d in dets:
            seen.setdefault(d, p)
        if detector is None and len(seen) > 1:
            (a, pa_), (b, pb) = list(seen.items())[:2]
            raise SelectError(f"scores: {pb} holds detector {b!r} but {pa_} holds {a!r}; a score folder holds one "
                              "detector (choose one with --detector)")
        low = _min_sentence_index(p, meta)
        if low is not None and low < CAPTION_INDEX:
            raise SelectError(f"scores: {p} has sentence_index {low} (expected -1 for a caption or >= 0)")
    if detector is not None and not chosen_found:
        raise SelectError(f"--detector {detector}: no rows of that detector in {path} (it holds {sorted(seen)})")
    folder_ = ScoreFolder(path, parts, manifest or {}, status, expected or next(iter(seen), None), other)
    _check_records(folder_)
    return folder_


# ------------------------------------------------------------------------------------------------ integrity
def _check_records(folder: ScoreFolder) -> None:
    """Refuse a part whose size or content hash differs from the manifest's record of it; fill ``fingerprints``
    (every part) and ``vouched`` (recorded, unchanged parts without a repeated row)."""
    records = folder.manifest.get(RECORDS) or {}
    for p in folder.parts:
        now = folder.fingerprints[p.name] = _content(p)
        rec = records.get(p.name)
        if rec is None:
            continue
        if not matches(p, rec, now):
            raise SelectError(f"scores: {p} is not the part `halsift score` wrote (its size or content hash differs "
                              f"from {SCORE_MANIFEST}: altered, swapped or replaced since); rescore it (delete it and "
                              "rerun the score command)")
        if rec.get("repeated_rows") == 0:
            folder.vouched.add(p.name)


def part_stats_of(p: Path) -> dict:
    """A part's own stats from its parquet metadata (``{}`` when it has none)."""
    meta = pq.ParquetFile(p).metadata.metadata or {}
    try:
        stats = json.loads(meta.get(PART_META_KEY, b"{}"))
    except ValueError:
        return {}
    return stats if isinstance(stats, dict) else {}


def check_sources(folder: ScoreFolder, shards: list[Path]) -> dict:
    """Refuse an input shard whose size or content hash differs from the fingerprint its part (``part-<shard>``)
    records: the shard was replaced at the same path, or the parts were swapped (the modification time is not
    compared: a copy is the same shard). Returns what a selection's manifest records: shards checked, shards whose
    part records no fingerprint, shards without a part, parts with and without a record in the score manifest, and
    ``data_digest`` (one hex digest of every shard's name, size and content hash)."""
    by_name = {p.name: p for p in folder.parts}
    checked = unrecorded = without = 0
    h = hashlib.blake2b(digest_size=16)
    for shard in shards:
        now = file_fingerprint(shard)
        h.update(json.dumps([shard.name, now["size"], now["hash"]]).encode())
        part = by_name.get(part_name(0, shard.name))
        if part is None:
            without += 1
            continue
        fp = part_stats_of(part).get("source_fp")
        if not isinstance(fp, dict) or "hash" not in fp:
            unrecorded += 1
            continue
        if fp.get("full"):  # scored with --full-hash: compared with the whole shard's hash
            now = refingerprint(shard, fp)
        if (fp.get("size"), fp.get("hash")) != (now["size"], now["hash"]):
            raise SelectError(f"data: {shard} is not the shard {part} was scored from (its size or content hash "
                              "differs from the fingerprint the part records: replaced at the same path, or parts "
                              "swapped?); rescore it, or give the shards that were scored")
        checked += 1
    recorded = sum(1 for p in folder.parts if p.name in (folder.manifest.get(RECORDS) or {}))
    return {"parts_recorded": recorded, "parts_unrecorded": len(folder.parts) - recorded,
            "shards_checked": checked, "shards_unrecorded": unrecorded, "shards_without_part": without,
            "data_digest": h.hexdigest()}


def repeated_rows_error(key: str, index: int, where: list[Path], total: int) -> SelectError:
    """The one line both selections give for a repeated (key, sentence_index) score row."""
    return SelectError(f"scores: row (key={key!r}, sentence_index={index}) appears more than once "
                       f"({' and '.join(str(p) for p in where)}; {total} repeated rows in all)")


def check_repeated_rows(folder: ScoreFolder, detector: str | None = None) -> None:
    """Raise :func:`repeated_rows_error` when a part repeats a (key, sentence_index) row (of ``detector``, when the
    parts hold several). Reads only the parts the manifest does not vouch for, one at a time."""
    first, total = None, 0
    for p in folder.parts:
        if p.name in folder.vouched:
            continue
        cols = ["key", "sentence_index"] + (["detector"] if folder.other_detectors else [])
        t = pq.read_table(p, columns=cols)
        if folder.other_detectors:
            t = t.filter(pc.equal(t["detector"], detector)).drop_columns(["detector"])
        counts = t.group_by(["key", "sentence_index"], use_threads=False).aggregate([("key", "count")])
        dup = counts.filter(pc.greater(counts["key_count"], 1))
        total += len(dup)
        if len(dup) and first is None:
            first = (dup["key"][0].as_py(), dup["sentence_index"][0].as_py(), p)
    if first is not None:
        raise repeated_rows_error(first[0], first[1], [first[2]], total)
