"""The one set of checks and the one output-folder state of ``halsift select``, whichever engine runs it (the
in-memory :func:`halsift.filtering.selection.select.select` or the out-of-core, resumable
:func:`halsift.filtering.selection.resumable.select_resumable`).

:func:`prepare` runs before anything is written:

1. the score folder (:func:`halsift.filtering.selection.score_folder.check_score_folder`: manifest, parts, detectors, each
   part's recorded size and content hash) and a (key, sentence_index) row repeated within a part;
2. the output folder (:func:`check_out`): it may not be, contain or lie inside the score folder, nor hold an input
   shard;
3. the input shards against the fingerprints their parts record (:func:`halsift.filtering.selection.score_folder.check_sources`);
4. the folder's state (:func:`open_selection`): ``OUT/_select/filter.json`` records the selection's arguments and
   inputs (score parts' and shards' digest included) before its first output. A rerun with the same arguments
   resumes it (the resumable engine per shard; the in-memory engine writes it again from the start, to the same
   bytes) or, when complete, returns its manifest as it is; other arguments, or a folder holding anything else,
   are refused with one line.

In the shard pass both engines read shards through :func:`halsift.corpus.shards.iter_shard`, the one reader: a key
repeated within one input shard is skipped and counted (kind ``duplicate``), so the first occurrence is selected,
as ``halsift score`` scores only the first.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from halsift.execution.run_folder import refusal, settings_diff
from halsift.corpus.safe_paths import remove_file, remove_tree
from halsift.corpus.images import SkipCounter
from halsift.corpus.shards import Sample, ShardFormatError, ShardWriter, expand_shards, write_json_atomic
from halsift.filtering.selection.score_folder import (ScoreFolder, SelectError, SelectionMismatch, check_repeated_rows,
                                                     check_score_folder, check_sources)

STATE = "_select"  # OUT/_select: filter.json, and the resumable engine's markers and claims
FILTER = "filter.json"
VOLATILE = ("scores_status",)  # recorded, not compared: a partial score folder may finish between two runs
# the defaults of selection arguments that an older filter.json may lack (a field absent from an old record compares
# equal only to its default; one without a default here, only to None, as it always did)
FILTER_DEFAULTS = {"per_captioner": False, "random_baseline": False, "keys_only": False, "allow_partial": False,
                   "compose": None, "maxcount": None}
OUTPUTS = ("*.tar", "*_stats.json", "sizes.json", "kept.parquet", "_kept_by_part.parquet", "manifest.json",
           ".*.tmp*", ".*.work")


@dataclass
class Prepared:
    """A checked selection: its score folder, input shards, output folder and ``filter`` (the manifest's)."""

    folder: ScoreFolder
    shards: list[Path]
    out: Path
    filt: dict
    checks: dict  # what was checked (the manifest's ``scores_check``)
    done: dict | None  # the complete manifest of this same selection, when the folder already holds it
    created: bool  # the output folder did not exist before this run


def check_out(out: Path, scores: Path, shards: list[Path]) -> None:
    """Refuse an output folder that is, contains or lies inside the score folder, or holds an input shard."""
    o = out.resolve()
    s = (scores if scores.is_dir() else scores.parent).resolve()
    how = ("is the score folder" if o == s else "lies inside the score folder" if s in o.parents else
           "contains the score folder" if o in s.parents else None)
    if how:
        raise SelectError(f"out: {out} {how} {scores}; write the selection to a folder of its own")
    held = next((p for p in shards if o in p.resolve().parents), None)
    if held is not None:
        raise SelectError(f"out: {out} holds the input shard {held}; write the selection to a folder of its own")


def prepare(scores: str | os.PathLike, data, out: str | os.PathLike, args: dict, *, detector: str | None,
            allow_partial: bool, meta_defaults: dict) -> Prepared:
    """Every check of a selection (see the module docstring), then the output folder's state; raises
    :class:`SelectError` (one line) before anything is written. ``args``: the selection's own arguments (keep,
    top_k, threshold, unit, agg, per_captioner, random_baseline, seed, engine, ...)."""
    folder = check_score_folder(scores, detector, allow_partial)
    check_repeated_rows(folder, detector)
    shards = expand_shards(data)
    out = Path(out)
    check_out(out, Path(scores), shards)
    checks = check_sources(folder, shards)
    filt = {"scores": str(Path(scores).resolve()), "data": [str(p.resolve()) for p in shards], **args,
            "agg": args.get("agg") if args.get("unit") == "caption" else None, "detector": folder.detector,
            "allow_partial": allow_partial, "scores_status": folder.status, "meta_defaults": meta_defaults,
            "scores_digest": folder.digest(), "data_digest": checks.pop("data_digest")}
    created = not out.exists()
    return Prepared(folder, shards, out, filt, checks, open_selection(out, filt), created)


def open_selection(out: Path, filt: dict) -> dict | None:
    """The output folder's one check: the complete manifest when it holds this same selection; ``None`` when it is
    new (``filter.json`` and a ``running`` manifest are written) or holds this selection unfinished. Raises
    :class:`SelectError` when it holds another selection or anything that is not one."""
    state = out / STATE / FILTER
    if state.exists():
        try:
            old = json.loads(state.read_text())
        except ValueError:
            old = {}
        old = old if isinstance(old, dict) else {}
        new = {k: v for k, v in filt.items() if k not in VOLATILE}
        k = settings_diff(old, new, {k: FILTER_DEFAULTS.get(k) for k in new})
        if k is not None:
            raise SelectionMismatch("out: " + refusal(out, k, old, new, "a selection", hint="choose a new folder"))
        m = _manifest(out)
        return m if m is not None and m.get("status") == "complete" else None
    if out.exists() and (any(out.glob("*.tar")) or (out / "manifest.json").exists() or (out / "kept.parquet").exists()
                         or (out / STATE).exists()):
        raise SelectionMismatch(f"out: {out} already holds shards or a manifest; choose a new folder")
    # OUT/_select appears with its filter.json in it (a folder renamed into place), never empty: a task starting
    # meanwhile finds either no _select (and starts the same way; its rename then loses and it reads the winner's
    # filter) or this selection's filter, never a bare _select it would take for another selection's leftovers
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{STATE}-", dir=out))
    write_json_atomic(staging / FILTER, filt)
    try:
        os.rename(staging, out / STATE)
    except OSError:  # another task's _select is in place: its filter decides
        remove_tree(staging, ignore_errors=True)
        return open_selection(out, filt)
    write_json_atomic(out / "manifest.json", {"status": "running", "filter": filt})
    return None


def _manifest(out: Path) -> dict | None:
    try:
        m = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def clear_outputs(out: Path) -> None:
    """Remove what an unfinished run of a selection wrote (its ``filter.json`` stays), so that it is written again."""
    for pattern in OUTPUTS:
        for f in out.glob(pattern):
            if f.is_dir():
                remove_tree(f, ignore_errors=True)
            else:
                remove_file(f)
    for sub in (out / STATE).iterdir() if (out / STATE).is_dir() else ():
        if sub.is_dir():
            remove_tree(sub, ignore_errors=True)
        elif sub.name != FILTER:
            remove_file(sub)


def remove_selection(out: Path, created: bool) -> None:
    """Undo a failed selection: the folder when this run created it, else what it wrote."""
    if created:
        remove_tree(out, ignore_errors=True)
        return
    clear_outputs(out)
    remove_tree(out / STATE, ignore_errors=True)


def write_outputs(writer: ShardWriter, samples: list[Sample], skipped: SkipCounter) -> bool:
    """Write one source sample's outputs, or none of them: a sample the writer rejects is skipped and counted
    (kind ``bad_sample``) and the shard goes on."""
    try:
        for smp in samples:
            writer.validate(smp)
    except ShardFormatError as e:
        skipped.add(samples[0].meta.get("parent_key", samples[0].key), str(e), "bad_sample")
        return False
    for smp in samples:
        writer.write(smp)
    return True
