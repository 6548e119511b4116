"""The open_clip model an evaluation command loads (``eval zeroshot``, ``eval compositional``): the same checks and
loader as ``eval retrieval``, and the batched image / text encoders they share."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from halsift.corpus.config import ConfigError, field


def check_model_settings(model: str, pretrained: str, batch_size: int) -> None:
    """The settings checks of ``eval retrieval``, for any command that loads an open_clip model."""
    if not model:
        raise ValueError("model: required")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if pretrained and os.sep in pretrained and not os.path.isfile(pretrained):
        raise ValueError(f"pretrained: {pretrained} is not a file")


@dataclass
class ClipEvalSettings:
    """The open_clip model a CLIP evaluation loads and how it encodes: the settings ``eval retrieval``,
    ``eval zeroshot`` and ``eval compositional`` share (one definition, one check)."""

    model: str = field("", help="open_clip architecture (or halsift-tiny)")
    pretrained: str = field("", help="pretrained tag, weights file (e.g. RUN/final/open_clip_model.safetensors) or "
                                     "random (a seeded random init, asked for by name)")
    batch_size: int = field(64, range="[1, inf)", help="encoding batch size")
    device: str = field("auto", help="auto | cpu | cuda[:N]")
    precision: Literal["auto", "bf16", "fp32"] = field("auto", help="auto: bf16 autocast on a GPU, fp32 on a CPU "
                                                                      "(the same rule as training's in-loop eval)")

    def validate(self) -> None:
        check_model_settings(self.model, self.pretrained, self.batch_size)


def load_eval_model(model: str, pretrained: str, device: str):
    """``(model, preprocess, tokenizer, device)`` through the one open_clip loader
    (:func:`halsift.filtering.models.clip_models.load_clip`: random weights only when asked for by name,
    ``--pretrained random``, seeded; ``.safetensors`` files only), the ``auto`` device resolved."""
    import torch

    from halsift.filtering.models.clip_models import load_clip

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    try:
        m, preprocess, tokenizer = load_clip(model, pretrained or None)
    except ValueError as e:
        raise ConfigError(str(e).replace("pretrained=", "--pretrained ").replace("arch=", "model=")) from None
    return m.to(device), preprocess, tokenizer, device


def encode_images(model, images: Iterable, device, batch_size: int, precision: str = "auto",
                  total: int | None = None, desc: str = "images") -> np.ndarray:
    """Image embeddings (n, d) float32 of preprocessed image tensors, in batches (bf16 autocast per ``precision``,
    the rule of :func:`halsift.eval.metrics.retrieval.use_bf16`); a progress bar with throughput."""
    import torch

    from halsift.corpus.progress import progress
    from halsift.eval.metrics.retrieval import use_bf16

    feats, batch = [], []
    bf16 = use_bf16(precision, device)
    bar = progress(total=total, desc=desc, unit="img", disable=total is not None and total < 2 * batch_size)

    def flush() -> None:
        with torch.inference_mode(), torch.autocast(torch.device(device).type, torch.bfloat16, enabled=bf16):
            feats.append(model.encode_image(torch.stack(batch).to(device)).float().cpu())
        bar.update(len(batch))
        batch.clear()

    try:
        for x in images:
            batch.append(x)
            if len(batch) == batch_size:
                flush()
        if batch:
            flush()
    finally:
        bar.close()
    return torch.cat(feats).numpy() if feats else np.zeros((0, 0), dtype=np.float32)


def encode_texts(model, tokenizer: Callable, texts: Sequence[str], device, batch_size: int,
                 precision: str = "auto") -> np.ndarray:
    """Text embeddings (n, d) float32 of ``texts``, in batches."""
    import torch

    from halsift.eval.metrics.retrieval import use_bf16
    from halsift.filtering.models.clip_models import encode_text

    feats = []
    bf16 = use_bf16(precision, device)
    with torch.inference_mode(), torch.autocast(torch.device(device).type, torch.bfloat16, enabled=bf16):
        for lo in range(0, len(texts), batch_size):
            feats.append(encode_text(model, tokenizer(list(texts[lo:lo + batch_size])).to(device)).float().cpu())
    return torch.cat(feats).numpy()


def eval_mode(model):
    """A context manager: ``model.eval()`` inside, its training flag restored after."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        was = model.training
        model.eval()
        try:
            yield model
        finally:
            model.train(was)

    return cm()
