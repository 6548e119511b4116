"""The recipe stages in run order, one module each (``halsift run``: :mod:`halsift.launch.recipe` runs them).

A stage module holds the stage's body and its own helpers and ends with ``STAGE = Stage(name, inputs, run)``
(:class:`~halsift.launch.stages.base.Stage`); it may import the stages before it (what they made), never those
after. Adding a stage: its module here, its line in :data:`REGISTRY` (where it runs) and its name at the same place
in ``recipe_config.STAGES``, its recipe section (a field of ``recipe_config.Recipe``).
"""

from __future__ import annotations

from halsift.launch.stages import dedup, detectors, eval, finetune, pretrain, report, score, select, world
from halsift.launch.stages.base import Paths, Stage, resolve_paths

# name -> stage, in run order (recipe_config.STAGES, a recipe's `stages`, `halsift run --force STAGE`)
REGISTRY: dict[str, Stage] = {m.STAGE.name: m.STAGE for m in (
    world,
    pretrain,
    detectors,
    dedup,
    score,
    select,
    finetune,
    eval,
    report,
)}

__all__ = ["REGISTRY", "Paths", "Stage", "resolve_paths"]
