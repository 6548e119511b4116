"""A recipe stage's coarse marker, ``<run_dir>/<stage>/_done.json``: written last by the runner
(:mod:`halsift.launch.recipe`), read by it and by the other ranks of a launch (:mod:`halsift.launch.recipe_ranks`).
It may only skip a stage whose inputs' fingerprint still matches, whose folder still holds what the stage left there
and that was made from what the stage before it holds now (:func:`outputs_hold`, ``made_from``); what a re-run stage
reuses is the execution layer's decision (:mod:`halsift.execution.run_folder`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

DONE = "_done.json"  # a stage's coarse marker: complete, from these inputs (it may only skip, never decide reuse)
UNTRACKED = ("wandb",)  # folders a stage's outputs are not: wandb writes its offline files after the stage ends


def stage_record(stage_dir: Path) -> dict | None:
    """The stage's marker (``_done.json``), or ``None`` when it has not completed (or the marker is unreadable)."""
    try:
        value = json.loads((stage_dir / DONE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def mark_stage_done(stage_dir: Path, info: dict, wall_s: float, inputs: dict, made_from: str | None = None) -> None:
    """Write the stage's marker last, atomically: what it returned, its inputs' fingerprint, its wall time, what its
    folder holds (:func:`outputs_state`) and ``made_from`` (the content digest of the stage before it)."""
    from halsift.corpus.shards import write_json_atomic

    stage_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(stage_dir / DONE, {**info, "inputs": inputs, "wall_s": round(wall_s, 2),
                                         "outputs": outputs_state(stage_dir), "made_from": made_from})


def _files(stage_dir: Path) -> list[tuple[str, os.stat_result]]:
    """Every file (and link) under ``stage_dir`` but its marker and the :data:`UNTRACKED` folders, by relative path."""
    found = []
    for root, dirs, files in os.walk(stage_dir):
        dirs[:] = sorted(d for d in dirs if d not in UNTRACKED)
        for name in files:
            path = Path(root, name)
            rel = path.relative_to(stage_dir).as_posix()
            if rel != DONE:
                found.append((rel, path.lstat()))
    return sorted(found)


def stat_digest(stage_dir: Path, files: list | None = None) -> str:
    """A digest of the folder's file names, sizes and modification times: cheap, changed by any write."""
    rows = [[rel, st.st_size, st.st_mtime_ns] for rel, st in (_files(stage_dir) if files is None else files)]
    return hashlib.blake2b(json.dumps(rows).encode(), digest_size=16).hexdigest()


def folder_content_digest(stage_dir: Path, files: list | None = None) -> str:
    """A digest of the folder's file names and whole contents (:func:`~halsift.corpus.fingerprint.file_fingerprint`
    with ``full``; a link: its target); the same for a copy of the folder. Not
    :func:`halsift.execution.run_folder.content_digest`, which reads a score folder's part records."""
    from halsift.corpus.fingerprint import file_fingerprint

    h = hashlib.blake2b(digest_size=16)
    for rel, st in _files(stage_dir) if files is None else files:
        path = stage_dir / rel
        h.update(json.dumps([rel, st.st_size]).encode())
        h.update((os.readlink(path) if path.is_symlink() else file_fingerprint(path, full=True)["hash"]).encode())
    return h.hexdigest()


def outputs_state(stage_dir: Path) -> dict:
    """What a marker records of its folder: ``{"stat": stat_digest, "content": folder_content_digest}`` (one walk)."""
    files = _files(stage_dir)
    return {"stat": stat_digest(stage_dir, files), "content": folder_content_digest(stage_dir, files)}


def outputs_hold(stage_dir: Path, record: dict) -> bool:
    """Whether the folder still holds what its marker recorded: the same names, sizes and times, or (a copy, a
    ``touch``) the same contents, whose times the marker then takes, so that the next check is cheap again. A marker
    of an older halsift that recorded nothing holds."""
    saved = record.get("outputs")
    if not isinstance(saved, dict):
        return True
    files = _files(stage_dir)
    now = stat_digest(stage_dir, files)
    if saved.get("stat") == now:
        return True
    if saved.get("content") != folder_content_digest(stage_dir, files):
        return False
    from halsift.corpus.shards import write_json_atomic

    write_json_atomic(stage_dir / DONE, {**record, "outputs": {**saved, "stat": now}})
    return True


def made_from_holds(record: dict, previous: dict | None) -> bool:
    """Whether a stage was made from what the marker of the stage before it (``previous``) records now; a marker of
    an older halsift, or the first stage, holds."""
    if previous is None or "made_from" not in record or not isinstance(previous.get("outputs"), dict):
        return True
    return record["made_from"] == previous["outputs"].get("content")


__all__ = ["DONE", "folder_content_digest", "made_from_holds", "mark_stage_done", "outputs_hold", "outputs_state",
           "stage_record", "stat_digest"]
