"""The select stage: one selection per scored name and per ``select.variants`` entry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from halsift.launch.stages.base import Paths, Stage
from halsift.launch.stages.guarantee import plan as plan_guarantee
from halsift.launch.stages.score import scored_names, scores_dir
from halsift.launch.stages.shared import log_stage

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def filter_names(r: Recipe) -> list[str]:
    """Every selection that is fine-tuned and compared: the scored names, then ``select.variants``."""
    return scored_names(r) + list(r.select.variants)


def stage_select(r: Recipe, p: Paths) -> dict:
    """One selection per filter (a finished one is reused, a half-written one cleared and redone)."""
    from halsift.filtering.selection.select import select
    from halsift.filtering.selection.resumable import reuse_or_clear

    from halsift.launch.select_compose import recipe_composition

    info = {}
    folders = {n: str(scores_dir(p, n, "corpus")) for n in scored_names(r)}
    for name in filter_names(r):
        scored, how = r.select.resolved(name)
        compose = recipe_composition(r.select, scored, folders, p.corpus, str(p.stage("basic") / "corpus"))
        how, guarantee = plan_guarantee(r, p, scored, how)  # select.max_hallucination: the certified threshold
        done = reuse_or_clear(p.named("select", name), scores_dir(p, scored, "corpus"), **how,
                              per_captioner=r.select.per_captioner, seed=r.seed,
                              compose=compose.record() if compose is not None else None)
        if done is not None:  # finished before the stage was killed; a half-written one was cleared above
            info[name] = done
            continue
        manifest = select(scores_dir(p, scored, "corpus"), p.corpus, p.named("select", name), **how,
                          per_captioner=r.select.per_captioner, seed=r.seed,
                          meta_defaults={"captioner": r.select.captioner, "source": r.select.source},
                          compose=compose)
        if guarantee is not None:
            from halsift.filtering.selection.guaranteed import record_guarantee

            manifest = record_guarantee(p.named("select", name), manifest, *guarantee)
        info[name] = manifest
    log_stage(r, p, "select", {name: p.named("select", name) for name in info})
    return {"selections": info}


STAGE = Stage("select", ("select",), stage_select)
