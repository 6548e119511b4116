"""The world stage: generate the synthetic world into ``<run_dir>/world``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from halsift.launch.stages.base import Paths, Stage

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def stage_world(r: Recipe, p: Paths) -> dict:
    """Generate the synthetic world (corpus, bench, retrieval and pretrain data) from the recipe's seed."""
    from halsift.synth.world import default_workers, generate_world

    kw = r.world.generator_kwargs()
    workers = default_workers(kw["images"], kw["pretrain_images"])  # the CLI's process: spawned workers may start
    info = generate_world(p.stage("world"), seed=r.seed, overwrite=True, workers=workers, **kw)
    return {"world": info if isinstance(info, dict) else {}}


STAGE = Stage("world", ("seed", "world"), stage_world, enabled=lambda r: r.world.enabled)
