"""The select stage: one selection per scored name and per ``select.variants`` entry.

Guaranteed selection (issue 32): ``select.max_hallucination`` / ``select.confidence`` /
``select.calibration``, and the compare report's guaranteed-selection row.

The default calibration of a filter is the bench scored by its detector (``<run>/score/NAME/calibration``, the
train and val rows of the bench; the bench's own score folder when ``eval.bench_split`` is '' and it already holds
every row), restricted to the train and val splits (never the evaluated split) and to the captioners the corpus's
scores name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from halsift.launch.stages.base import Paths, Stage
from halsift.launch.stages.score import calibration_splits, scored_names, scores_dir
from halsift.launch.stages.shared import log_stage

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def calibration_scores(r: Recipe, p: Paths, name: str) -> Path:
    """The score folder of the bench rows a filter is calibrated on (module docstring)."""
    return scores_dir(p, name, "bench" if not r.eval.bench_split else "calibration")


def calibration_args(r: Recipe, p: Paths, name: str) -> dict:
    """``plan_guarantee``'s calibration, captioners and splits for filter ``name``."""
    if r.select.calibration:
        return {"calibration": r.select.calibration, "captioners": r.select.calibration_captioners,
                "splits": r.select.calibration_splits}
    from halsift.filtering.selection.guaranteed import CORPUS_CAPTIONERS

    return {"calibration": calibration_scores(r, p, name),
            "captioners": r.select.calibration_captioners or CORPUS_CAPTIONERS,
            "splits": r.select.calibration_splits or calibration_splits(r)}


def plan_guarantee(r: Recipe, p: Paths, scored: str, how: dict):
    """``(how, guarantee)``: the selection arguments with the certified threshold, and ``(Guarantee, Calibration)``
    (None without ``select.max_hallucination``, and for a repair selection, which keeps its amount)."""
    if r.select.max_hallucination is None or how.get("agg") == "repair":
        return how, None
    from halsift.filtering.selection.guaranteed import plan_guarantee

    a = calibration_args(r, p, scored)
    g = plan_guarantee(scores_dir(p, scored, "corpus"), a["calibration"], r.select.max_hallucination,
                       r.select.confidence, how.get("unit", "sentence"), how.get("agg", "min"), None,
                       a["captioners"], a["splits"])
    return {**how, "keep": None, "top_k": None, "threshold": g[0].threshold}, g


def report_rows(r: Recipe, p: Paths, names: list[str]) -> dict[str, dict]:
    """Per scored filter with calibration scores: the kept share (0-100) at A = 5 / 10 / 20 % (None: not
    certified), the best bound reachable and the calibration size; the report's guaranteed-selection rows. A
    recipe that selects whole captions also gets each filter's sentence-level row (``NAME/sentence``): a caption
    is hallucinated when any of its sentences is, so few labelled captions may certify nothing at all."""
    from halsift.filtering.selection.guarantee import GuaranteeError
    from halsift.filtering.selection.guaranteed import guaranteed_kept

    units = [(r.select.unit, r.select.agg if r.select.agg != "repair" else "prune", "")]
    if r.select.unit == "caption":
        units.append(("sentence", "min", "/sentence"))
    rows = {}
    for unit, agg, suffix in units:
        for n in names:
            a = calibration_args(r, p, n)
            corpus = scores_dir(p, n, "corpus")
            if not corpus.exists() or not Path(a["calibration"]).exists():
                continue
            try:
                rows[n + suffix] = guaranteed_kept(corpus, a["calibration"], r.select.confidence, unit=unit, agg=agg,
                                                   captioners=a["captioners"], splits=a["splits"])
            except (GuaranteeError, ValueError) as e:  # e.g. no bench rows of the corpus's captioners: in the row
                rows[n + suffix] = {"error": str(e)}
    return rows


def filter_names(r: Recipe) -> list[str]:
    """Every selection that is fine-tuned and compared: the scored names, then ``select.variants``."""
    return scored_names(r) + list(r.select.variants)


def stage_select(r: Recipe, p: Paths) -> dict:
    """One selection per filter. Each selection's folder keeps its own identity (its arguments and the digests of the
    scores and shards it was made from, :mod:`halsift.filtering.selection.guard`): a complete one of the same
    selection is returned as it is, an unfinished one resumes, and one made from other scores or arguments is the
    recipe's to replace (emptied, then made again), the other filters' untouched."""
    from halsift.corpus.safe_paths import remove_tree
    from halsift.execution.engines import run_job
    from halsift.filtering.selection.config import SelectConfig
    from halsift.filtering.selection.job import SelectJob, recipe_composition
    from halsift.filtering.selection.score_folder import SelectionMismatch

    info = {}
    folders = {n: str(scores_dir(p, n, "corpus")) for n in scored_names(r)}
    for name in filter_names(r):
        scored, how = r.select.resolved(name)
        compose = recipe_composition(r.select, scored, folders, p.corpus, str(p.stage("basic") / "corpus"))
        how, guarantee = plan_guarantee(r, p, scored, how)  # select.max_hallucination: the certified threshold
        dest = p.named("select", name)

        cfg = SelectConfig(scores=str(scores_dir(p, scored, "corpus")), data=p.corpus, out=str(dest),
                           **{k: v for k, v in how.items() if k != "random_baseline"},
                           per_captioner=r.select.per_captioner, seed=r.seed, captioner=r.select.captioner,
                           source=r.select.source, resumable=r.select.resumable,
                           memory_limit=r.select.memory_limit)

        def run():  # the command's library call (its engine chosen by the same flags: resumable, memory_limit)
            result = run_job(SelectJob(cfg, compose=compose, composed=True))
            print("\n".join(f"[halsift run] select.{name}: {line}" for line in result.lines), flush=True)
            return result.stats

        try:
            manifest = run()
        except SelectionMismatch as e:
            print(f"[halsift run] select.{name}: {e}; emptying it and selecting again", flush=True)
            remove_tree(dest)
            manifest = run()
        if guarantee is not None:
            from halsift.filtering.selection.guaranteed import record_guarantee

            manifest = record_guarantee(p.named("select", name), manifest, *guarantee)
        info[name] = manifest
    log_stage(r, p, "select", {name: p.named("select", name) for name in info})
    return {"selections": info}


STAGE = Stage("select", ("select",), stage_select)
