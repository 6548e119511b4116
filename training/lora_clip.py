"""LoRA (peft) on both open_clip towers plus a small binary head: the ``clip`` kind of ``train detector``.

open_clip's residual blocks hold an ``nn.MultiheadAttention`` (``attn``; its ``out_proj`` is never called through
``forward``, so LoRA on ``out_proj`` alone would be silently ignored) and the MLP linears ``c_fc`` / ``c_proj``.
peft (>= 0.13) adapts ``nn.MultiheadAttention`` as one module, covering ``in_proj`` and ``out_proj`` together, so
the default targets are ``attn``, ``c_fc`` and ``c_proj`` in both towers. The head and the scoring live in
:mod:`halsift.filtering.detectors.lora` (training and scoring share them).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from halsift.filtering.detectors.base import Item
from halsift.filtering.detectors.lora import ClipHead, ClipLoraScorer, LoraClipDetector, load_head, save_head
from halsift.training.detector_config import CLIP_TARGETS, DetectorTrainConfig


def add_lora(model: nn.Module, targets: Sequence[str], r: int, alpha: float, dropout: float):
    """Wrap an open_clip model with a peft LoRA adapter on ``targets`` (every other weight frozen)."""
    from peft import LoraConfig, get_peft_model

    found = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in targets if t not in found]
    if missing:
        raise ValueError(f"target_modules: {missing} not found in the CLIP model (module names ending in e.g. "
                         f"{sorted(x for x in found if x in ('attn', 'c_fc', 'c_proj', 'out_proj', 'proj'))})")
    cfg = LoraConfig(r=int(r), lora_alpha=float(alpha), lora_dropout=float(dropout), target_modules=list(targets))
    return get_peft_model(model, cfg)


def embed_dim(model: nn.Module) -> int:
    """Width of the joint embedding of an open_clip model."""
    proj = getattr(model, "text_projection", None)
    if isinstance(proj, torch.Tensor):
        return int(proj.shape[-1])
    if isinstance(proj, nn.Linear):
        return int(proj.out_features)
    with torch.no_grad():
        return int(model.encode_text(torch.zeros(1, 8, dtype=torch.long)).shape[-1])


def collate(examples: Sequence[tuple[Item, int]], preprocess, tokenizer) -> dict:
    """``[(item, label)]`` -> ``images`` (each distinct image once), ``tokens``, ``image_index``, ``labels``."""
    slot: dict[str, int] = {}
    images, idx = [], []
    for it, _ in examples:
        k = it.image_id or it.key
        if k not in slot:
            slot[k] = len(images)
            images.append(preprocess(it.image))
        idx.append(slot[k])
    return {"images": torch.stack(images), "tokens": tokenizer([it.sentence for it, _ in examples]),
            "image_index": torch.tensor(idx), "labels": torch.tensor([y for _, y in examples], dtype=torch.float32)}


class ClipTask:
    """The ``clip`` half of a ``train detector`` run (see :func:`halsift.training.detector_train.build_task`)."""

    kind = "clip"

    def __init__(self, cfg: DetectorTrainConfig) -> None:
        from halsift.filtering.detectors.clip import ClipDetector
        from halsift.filtering.detectors.spec import load_detector
        from halsift.training.detector_config import absolute_spec

        base = load_detector(absolute_spec(cfg.base))
        if not isinstance(base, ClipDetector):
            raise ValueError(f"base: {cfg.base!r} is not a clip detector spec")
        self.base_spec, self.arch = base.spec, base.arch
        self.preprocess, self.tokenizer = base.preprocess, base.tokenizer
        self.targets = list(cfg.target_modules or CLIP_TARGETS)
        clip = base.model.float()
        self.peft = add_lora(clip, self.targets, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout)
        self.module = ClipLoraScorer(self.peft.base_model.model, ClipHead(embed_dim(clip), cfg.head_hidden))

    def param_groups(self, cfg: DetectorTrainConfig) -> list[dict]:
        head = list(self.module.head.parameters())
        ids = {id(p) for p in head}
        lora = [p for p in self.module.parameters() if p.requires_grad and id(p) not in ids]
        return [{"params": lora}, {"params": head, "lr": cfg.head_lr or cfg.lr}]

    def collate(self, examples: Sequence[tuple[Item, int]]) -> dict:
        return collate(examples, self.preprocess, self.tokenizer)

    def forward(self, model: nn.Module, batch: dict, device) -> torch.Tensor:
        return model(batch["images"].to(device), batch["tokens"].to(device), batch["image_index"].to(device))

    def detector(self, module: ClipLoraScorer) -> LoraClipDetector:
        return LoraClipDetector(module, self.preprocess, self.tokenizer)

    def export(self, folder: Path) -> dict:
        """Adapter (peft ``save_pretrained``: safetensors) + head; returns the ``detector.yaml`` fields."""
        from halsift.filtering.models.lora_adapters import save_adapter

        save_adapter(self.peft, folder)
        save_head(self.module.head, folder / "head.safetensors")
        return {"kind": "clip", "base": self.base_spec, "adapter": True, "head": "head.safetensors",
                "target_modules": self.targets}

    def load_export(self, folder: Path) -> None:
        """Load an exported adapter + head back into this task's model (e.g. the best one before merging)."""
        from peft import set_peft_model_state_dict

        from halsift.corpus.weights import read_safetensors

        set_peft_model_state_dict(self.peft, read_safetensors(folder / "adapter_model.safetensors", "adapter"))
        self.module.head.load_state_dict(load_head(folder / "head.safetensors").state_dict())

    def export_merged(self, folder: Path) -> None:
        """``merged/``: the adapter merged into the base (``open_clip_model.safetensors``, with
        ``open_clip_config.json``: ``local-dir:merged`` loads the CLIP in plain open_clip) + head, no peft needed."""
        from halsift.filtering.models.lora_adapters import write_description
        from halsift.filtering.detectors.spec import format_spec, parse_spec
        from halsift.training.open_clip_folder import write_open_clip_folder

        folder.mkdir(parents=True, exist_ok=True)
        merged = copy.deepcopy(self.peft).merge_and_unload()
        family, opts = parse_spec(self.base_spec)
        write_open_clip_folder(merged, self.arch, folder, self.tokenizer)
        save_head(self.module.head, folder / "head.safetensors")
        opts.pop("pretrained", None)
        opts["checkpoint"] = "./open_clip_model.safetensors"
        write_description(folder, {"kind": "clip", "base": format_spec(family, opts), "adapter": False,
                                   "head": "head.safetensors"})


__all__ = ["ClipTask", "add_lora", "collate", "embed_dim"]
