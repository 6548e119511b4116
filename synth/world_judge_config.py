"""Settings of the world's VLM judge and the detector spec it yields: no torch here, so a recipe's dry run can
validate them in milliseconds (:mod:`halsift.synth.world_judge` builds the judge)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class WorldJudgeSettings:
    """Knobs of :func:`build_world_judge` (defaults: a few CPU minutes on the default world)."""

    arch: str = "llava"
    extra_images: int = 0  # fresh labelled captions (own seed stream, not in corpus/ or bench/) added to train
    swap_negatives: float = 0.0  # share of correct train sentences also paired with another image as negatives
    image_size: int = 32  # llava: vision input size ((size/patch)^2 image tokens)
    patch_size: int = 8  # llava: vision patch size
    fan_in_projector: bool = False  # llava: fan-in projector init (the captioner then uses the image; no AUROC gain)
    world_vocab: bool = True  # train the tokenizer on the world's captions too: its words become whole tokens
    vocab_size: int = 1024
    pretrain_steps: int = 2400
    pretrain_batch: int = 16
    pretrain_lr: float = 2e-3
    judge_steps: int = 600
    judge_batch: int = 32
    judge_lr: float = 5e-4
    lora_r: int = 16
    eval_every: int = 25
    patience: int = 6
    # llava: open_clip halsift-tiny weights (e.g. RUN/pretrain/final/open_clip_model.safetensors) for the vision
    # tower, converted to HF CLIP (64 px, 16 px patches; image_size/patch_size are then ignored)
    vision_from: str = ""
    vision_arch: str = "halsift-tiny"
    vision_layer: int = -1  # with vision_from: LLaVA vision_feature_layer
    vision_select: str = "default"  # with vision_from: vision_feature_select_strategy (default | full)
    freeze_vision_pretrain: bool = True  # with vision_from: caption pre-training leaves the CLIP tower frozen
    # > 0: the detector is the z-score mean of the yes/no judge and the pre-trained captioner's image PMI
    # (vlm mode=pmi) against this many reference images (the world's first pretrain images); 0: the judge alone.
    # Scoring only: changing it reuses the trained models.
    pmi_references: int = 16


def world_judge_spec(out_dir: str | os.PathLike, settings: WorldJudgeSettings | None = None) -> str:
    """The detector spec :func:`build_world_judge` returns for ``out_dir`` (known before it is built)."""
    out, settings = Path(out_dir).resolve(), settings or WorldJudgeSettings()
    judge = f"lora:{out / 'judge' / 'adapter'}"
    if settings.pmi_references <= 0:
        return judge
    pmi = (f"vlm:model={out / 'pretrained'},mode=pmi,references={out / 'references'},"
           f"n_references={settings.pmi_references}")
    return f"ensemble:members=[{judge};{pmi}],norm=zscore"
