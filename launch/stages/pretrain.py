"""The pretrain stage: pre-train the base CLIP (unless ``model.pretrained`` is set)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from halsift.launch.stages.base import Paths, Stage
from halsift.launch.stages.shared import train_cfg

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def stage_pretrain(r: Recipe, p: Paths) -> dict:
    """Pre-train the base CLIP on the pretrain data, unless `model.pretrained` is set or it is disabled."""
    from halsift.training.clip_train import train

    if r.model.pretrained or not r.pretrain.enabled:
        return {"skipped": "model.pretrained is set" if r.model.pretrained else "pretrain.enabled is false"}
    cfg = train_cfg(r, r.pretrain, [p.pretrain_data], p.stage("pretrain"), "", r.seed)
    return {"metrics": train(cfg)}


STAGE = Stage("pretrain", ("data", "model", "pretrain"), stage_pretrain, clears=True)  # one output: the base CLIP
