"""wandb for ``halsift score`` and ``halsift select`` (``--wandb [offline|online]``; off unless asked for).

One run per finished command, written beside its output (``<out>/wandb/``; offline unless ``online`` is asked
for, so nothing leaves the machine until ``wandb sync``). What it holds comes from the manifest the command
already wrote, so a run resumed, split into tasks or run on Ray logs the same numbers:

- score: per part (one history step each) its items, samples, items/s and parse failures; in the summary the
  totals, this run's items/s, skipped samples (total and by kind), parse failures, parts resumed, wall time.
- select: in the summary candidates, kept units, kept fraction, samples written, skipped samples and corrupt
  shards, precision of the input and of the kept units, keys only in shards / only in scores, wall time and
  candidates/s.

``halsift run`` logs its score and select stages the same way (one run per stage, ``<detector or filter>/<field>``)
unless the recipe's ``wandb.mode`` is ``disabled``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from halsift.corpus.config import WandbFlag, wandb_mode_field, wandb_project_field  # noqa: F401 (re-exported)

def score_metrics(manifest: dict, out: Path) -> tuple[list[dict], dict]:
    """(history: one row per part, summary) of a complete score folder."""
    from halsift.filtering.scoring.parts import part_stats

    rows = []
    for name in manifest.get("part_files", []):
        s = part_stats(out / name)
        busy = s.get("time_model_s", 0.0) + s.get("time_data_s", 0.0)
        rows.append({"part/items": s.get("sentences", 0), "part/samples": s.get("samples", 0),
                     "part/items_per_s": round(s["sentences"] / busy, 2) if busy > 0 else None,
                     "part/parse_failures": s.get("parse_failures", 0),
                     "part/skipped": (s.get("skipped") or {}).get("total", 0)})
    skipped = manifest.get("skipped", {})
    summary = {"items": manifest.get("sentences"), "samples": manifest.get("samples"),
               "parts": manifest.get("parts"), "parts_resumed": manifest.get("parts_resumed"),
               "items_per_s": manifest.get("sentences_per_s"), "items_scored_this_run":
               manifest.get("sentences_scored_this_run"), "parse_failures": manifest.get("parse_failures"),
               "skipped": skipped.get("total", 0), "wall_time_s": manifest.get("wall_time_s"),
               **{f"skipped/{k}": v for k, v in (skipped.get("by_kind") or {}).items()}}
    return rows, summary


def select_metrics(manifest: dict) -> dict:
    """The summary of a complete selection (in-memory or resumable manifest); precision 0–100 whatever the
    manifest's age (:func:`halsift.filtering.selection.manifest_scale.on_percent_scale`)."""
    from halsift.filtering.selection.manifest_scale import on_percent_scale

    manifest = on_percent_scale(manifest)
    cand, kept = manifest.get("candidates") or 0, manifest.get("kept_units", 0)
    skipped = manifest.get("skipped", {}).get("total") if "skipped" in manifest else \
        manifest.get("skipped_samples", {}).get("count", 0)
    wall = manifest.get("wall_time_s")
    keys = manifest.get("keys", {})
    return {"candidates": cand, "kept_units": kept, "kept_fraction": round(kept / cand, 6) if cand else None,
            "samples_written": manifest.get("samples_written"), "skipped": skipped,
            "corrupt_shards": len(manifest.get("corrupt_shards", [])),
            "precision/input": manifest.get("precision", {}).get("input"),
            "precision/kept": manifest.get("precision", {}).get("kept"),
            "sentence_precision/input": manifest.get("sentence_precision", {}).get("input"),
            "sentence_precision/kept": manifest.get("sentence_precision", {}).get("kept"),
            "keys/only_in_shards": keys.get("only_in_shards"), "keys/only_in_scores": keys.get("only_in_scores"),
            "wall_time_s": wall, "candidates_per_s": round(cand / wall, 1) if wall else None}


def log_run(kind: str, out: Path, summary: dict, history: list[dict], mode: str, project: str,
            config: dict | None = None) -> str:
    """One wandb run in ``out/wandb``: the history rows as steps, then the summary; returns the run's folder."""
    import wandb

    name = f"{config['recipe']}-{kind}" if config and "recipe" in config else f"{kind}-{out.name}"
    run = wandb.init(project=project, name=name, job_type=kind, dir=str(out), mode=mode, config=config or {})
    try:
        for row in history:
            run.log({k: v for k, v in row.items() if v is not None})
        run.summary.update({k: v for k, v in summary.items() if v is not None})
        return str(Path(run.dir).parent)
    finally:
        run.finish()


def log_score(args: Any, manifest_path: Path) -> None:
    """After a complete ``halsift score`` (rank 0 / the last task), when ``--wandb`` was given (``args``: its
    ``ScoreConfig``)."""
    mode = getattr(args, "wandb", None)
    if not mode:
        return
    import json

    m = json.loads(manifest_path.read_text())
    rows, summary = score_metrics(m, manifest_path.parent)
    where = log_run("score", manifest_path.parent, summary, rows, mode, args.wandb_project,
                    {"detector": m.get("detector"), "unit": m.get("unit"), "engine": m.get("engine", "ranks")})
    print(f"wandb ({mode}): {where}", flush=True)


def log_select(args: Any, manifest: dict) -> None:
    """After a complete ``halsift select``, when ``--wandb`` was given (``args``: its ``SelectConfig``)."""
    mode = getattr(args, "wandb", None)
    if not mode:
        return
    where = log_run("select", Path(args.out), select_metrics(manifest), [], mode, args.wandb_project,
                    manifest.get("filter", {}))
    print(f"wandb ({mode}): {where}", flush=True)


def log_recipe_stage(stage: str, stage_dir: Path, folders: dict[str, Path], mode: str, project: str,
                     run_name: str) -> None:
    """A recipe's score or select stage as one run: each detector's / filter's summary under its name."""
    import json

    summary: dict = {}
    for name, folder in folders.items():
        if stage == "score":
            path = folder / "_manifest.json"
            if not path.exists():
                continue
            fields = score_metrics(json.loads(path.read_text()), folder)[1]
        else:
            fields = select_metrics(json.loads((folder / "manifest.json").read_text()))
        summary.update({f"{name}/{k}": v for k, v in fields.items()})
    log_run(stage, stage_dir, summary, [], mode, project, {"recipe": run_name})
