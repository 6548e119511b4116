"""A recipe stage's coarse marker, ``<run_dir>/<stage>/_done.json``: written last by the runner
(:mod:`halsift.launch.recipe`), read by it and by the other ranks of a launch (:mod:`halsift.launch.recipe_ranks`).
It may only skip a stage whose inputs' fingerprint still matches; what a re-run stage reuses is the execution
layer's decision (:mod:`halsift.execution.run_folder`)."""

from __future__ import annotations

import json
from pathlib import Path

DONE = "_done.json"  # a stage's coarse marker: complete, from these inputs (it may only skip, never decide reuse)


def stage_record(stage_dir: Path) -> dict | None:
    """The stage's marker (``_done.json``), or ``None`` when it has not completed (or the marker is unreadable)."""
    try:
        value = json.loads((stage_dir / DONE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def mark_stage_done(stage_dir: Path, info: dict, wall_s: float, inputs: dict) -> None:
    """Write the stage's marker last, atomically: what it returned, its inputs' fingerprint, its wall time."""
    from halsift.corpus.shards import write_json_atomic

    stage_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(stage_dir / DONE, {**info, "inputs": inputs, "wall_s": round(wall_s, 2)})


__all__ = ["DONE", "mark_stage_done", "stage_record"]
