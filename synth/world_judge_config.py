"""Settings of the world's VLM judge and the detector spec it yields: no torch here, so a recipe's dry run can
validate them in milliseconds (:mod:`halsift.synth.world_judge` builds the judge)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.config import field
from halsift.training.optimizer_config import optimizer_field


@dataclass
class WorldJudgeSettings:
    """Knobs of :func:`build_world_judge` (defaults: a few CPU minutes on the default world)."""

    arch: str = field("llava", help="the judge's architecture (llava: a tiny LLaVA)")
    extra_images: int = field(0, range="[0, inf)",
                              help="fresh labelled captions (own seed stream, not in corpus/ or bench/) added "
                                   "to train")
    swap_negatives: float = field(0.0, range="[0, 1]",
                                  help="share of correct train sentences also paired with another image as "
                                       "negatives")
    image_size: int = field(32, range="[1, inf)", help="llava: vision input size ((size/patch)^2 image tokens)")
    patch_size: int = field(8, range="[1, inf)", help="llava: vision patch size")
    fan_in_projector: bool = field(False, help="llava: fan-in projector init (the captioner then uses the image; "
                                               "no AUROC gain)")
    world_vocab: bool = field(True, help="train the tokenizer on the world's captions too: its words become whole "
                                         "tokens")
    vocab_size: int = field(1024, range="[1, inf)", help="tokenizer vocabulary size")
    pretrain_steps: int = field(2400, range="[1, inf)", help="caption pre-training steps")
    pretrain_batch: int = field(16, range="[1, inf)", help="caption pre-training batch size")
    pretrain_lr: float = optimizer_field("lr", 2e-3, help="caption pre-training learning rate")
    judge_steps: int = field(600, range="[1, inf)", help="yes/no LoRA tuning steps (at most; early-stopped on val)")
    judge_batch: int = field(32, range="[1, inf)", help="yes/no LoRA tuning batch size")
    judge_lr: float = optimizer_field("lr", 5e-4, help="yes/no LoRA tuning learning rate")
    lora_r: int = field(16, range="[1, inf)", help="LoRA rank of the judge")
    eval_every: int = field(25, range="[1, inf)", help="evaluate on the bench's val split every N judge steps")
    patience: int = field(6, range="[0, inf)", help="stop after this many evaluations without a better val AUROC")
    vision_from: str = field("", help="llava: open_clip weights (e.g. RUN/pretrain/final/open_clip_model.safetensors) "
                                      "for the vision tower, converted to HF CLIP (image_size/patch_size are then "
                                      "ignored); '' = a fresh tower")
    vision_arch: str = field("halsift-tiny", help="open_clip architecture of vision_from")
    vision_layer: int = field(-1, help="with vision_from: LLaVA vision_feature_layer")
    vision_select: str = field("default", help="with vision_from: vision_feature_select_strategy (default | full)")
    freeze_vision_pretrain: bool = field(True, help="with vision_from: caption pre-training leaves the CLIP tower "
                                                    "frozen")
    pmi_references: int = field(16, range="[0, inf)",
                                help="> 0: the detector is the z-score mean of the yes/no judge and the "
                                     "pre-trained captioner's image PMI (vlm mode=pmi) against this many reference "
                                     "images (the world's first pretrain images); 0: the judge alone. Scoring "
                                     "only: changing it reuses the trained models")


def world_judge_spec(out_dir: str | os.PathLike, settings: WorldJudgeSettings | None = None) -> str:
    """The detector spec :func:`build_world_judge` returns for ``out_dir`` (known before it is built)."""
    out, settings = Path(out_dir).resolve(), settings or WorldJudgeSettings()
    judge = f"lora:{out / 'judge' / 'adapter'}"
    if settings.pmi_references <= 0:
        return judge
    pmi = (f"vlm:model={out / 'pretrained'},mode=pmi,references={out / 'references'},"
           f"n_references={settings.pmi_references}")
    return f"ensemble:members=[{judge};{pmi}],norm=zscore"
