"""Caption-generation pre-training of a saved transformers VLM on shards: the caption task of
:mod:`halsift.training.engine`.

Each sample is the chat turn ``[image, "Describe this image in detail."]`` followed by its caption (the prompt of
:mod:`halsift.filtering.detectors.vlm_likelihood`, so ``vlm`` ``mode=pmi`` reads the captioner as it was trained); the loss is
the next-token cross-entropy on the caption tokens only. Step ``s``'s batch is the ``s``-th draw of a generator
seeded with ``seed``, so a resumed run sees the batches a straight run would. The trained model and its processor
are saved (``save_pretrained``) to ``save_to``; ``out`` is the engine's run folder.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from halsift.corpus.config import field as _f
from halsift.corpus.safe_paths import remove_tree, replace_path
from halsift.training.engine import Task, run
from halsift.training.optimizer_config import optimizer_section


CaptionOptimizer = optimizer_section(
    "CaptionOptimizer", lr=2e-3, warmup=20, fixed={"wd": 0.0, "schedule": "linear_floor"},
    help={"lr": "peak learning rate (AdamW, no weight decay)",
          "warmup": "linear warmup steps, then linear decay to 5% of the peak at the last step"})


@dataclasses.dataclass
class CaptionPretrainConfig(CaptionOptimizer):
    """One caption pre-training run; saved as ``config.json`` in the run folder (no wandb: metrics.jsonl only)."""

    model: str = _f("", help="folder of a saved transformers image-text-to-text model and its processor")
    shards: str = _f("", help="shard spec of the image-caption pairs")
    out: str = _f("", help="run folder: config.json, metrics.jsonl, checkpoints/")
    save_to: str = _f("", help="folder the trained model and processor are saved to (replaced atomically)")
    steps: int = _f(300, range="[1, inf)", help="optimizer steps")
    batch_size: int = _f(16, range="[1, inf)", help="captions per step")
    grad_clip: float = _f(1.0, range="[0, inf)", help="max gradient norm (0 = off)")
    freeze_vision: bool = _f(False, help="leave the vision tower as it is (LLaVA stage 1)")
    seed: int = _f(0, range="[0, inf)", help="seed of the batch order (and of anything drawn at random)")
    log_every: int = _f(10, range="[1, inf)", help="write a metrics.jsonl line every N steps")
    checkpoint_every: int = _f(0, range="[0, inf)", help="save a resumable checkpoint every N steps (0 = never)")
    keep_checkpoints: int = _f(1, range="[0, inf)", help="keep the newest K step checkpoints (0 = all)")
    resume: bool = _f(False, help="continue from the newest complete checkpoint in out/checkpoints")

    def validate(self) -> None:
        missing = [n for n in ("model", "shards", "out", "save_to") if not getattr(self, n)]
        if missing:
            raise ValueError(f"{missing[0]}: required")
        self.check_optimizer()  # and every declared range

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class CaptionTask(Task):
    """Next-token loss on the caption after the describe turn; ``caption_of(sample)`` is the text learnt ('' skips)."""

    desc, unit = "pretrain captioner", "sample"

    def __init__(self, cfg: CaptionPretrainConfig, caption_of: Callable | None = None,
                 show_progress: bool = True) -> None:
        cfg.validate()
        self.cfg, self.show_progress = cfg, show_progress
        self.caption_of = caption_of or (lambda s: str(s.caption).strip())
        self.losses: list[torch.Tensor] = []  # per step, on the device (read once at the end)

    def setup(self, accelerator) -> dict:
        self.accelerator = accelerator
        return {}

    def build(self, accelerator):
        from halsift.filtering.detectors.vlm_judge import VlmJudge
        from halsift.filtering.models.hf_vlm import load_vlm

        cfg = self.cfg
        model, self.processor = load_vlm(cfg.model, dtype="fp32")
        self.judge = VlmJudge(model, self.processor)  # its max_pixels cap and left-padded batch builder
        self.pairs = self._pairs()
        self.describe: dict[int, dict] = {}  # image index -> processor features: each image is processed once
        self.conts: dict[int, list[int]] = {}  # pair index -> its caption's token ids: each caption tokenized once
        if cfg.freeze_vision:  # LLaVA stage 1: the (pre-trained) vision tower stays as it is
            model.model.vision_tower.requires_grad_(False)
        optimizer, scheduler = cfg.build_optimizer([p for p in model.parameters() if p.requires_grad], cfg.steps)
        return model, optimizer, scheduler

    def _pairs(self) -> list[tuple]:
        """``(image, " caption<eos>")`` for every decodable sample with a caption."""
        from halsift.corpus.images import SkipCounter
        from halsift.corpus.sample import read_samples

        eos, skipped, pairs = self.processor.tokenizer.eos_token or "", SkipCounter(), []
        for s in read_samples(self.cfg.shards, skipped):
            text = self.caption_of(s)
            if text:
                pairs.append((s.image, " " + text + eos))
        if not pairs:
            raise ValueError(f"pretrain: no usable samples in {self.cfg.shards} ({skipped.summary()})")
        return pairs

    def batches(self, start: int):
        """Per step, ``batch_size`` pair indices drawn with replacement (the draws of earlier steps replayed)."""
        from halsift.filtering.detectors.vlm_likelihood import describe_features

        gen = torch.Generator().manual_seed(self.cfg.seed)
        tok = self.processor.tokenizer
        for step in range(self.cfg.steps):
            idx = torch.randint(len(self.pairs), (self.cfg.batch_size,), generator=gen).tolist()
            if step < start:
                continue
            for i in idx:
                if i not in self.describe:
                    self.describe[i] = describe_features(self.judge, self.pairs[i][0])
                if i not in self.conts:
                    self.conts[i] = tok(self.pairs[i][1], add_special_tokens=False)["input_ids"]
            conts = [self.conts[i] for i in idx]
            yield self.judge.full_batch([self.describe[i] for i in idx], conts), [len(c) for c in conts]

    def loss(self, model, batch) -> torch.Tensor:
        inputs, lengths = batch
        inputs = {k: v.to(self.accelerator.device) if torch.is_tensor(v) else v for k, v in inputs.items()}
        n = max(lengths)
        logits = model(**inputs, use_cache=False, logits_to_keep=n + 1).logits[:, :-1].float()
        target = inputs["input_ids"][:, -n:].clone()
        for r, k in enumerate(lengths):  # rows are left-padded: each continuation ends at the last column
            target[r, :n - k] = -100
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                 ignore_index=-100)
        self.losses.append(loss.detach().float())
        return loss

    def due(self, step: int) -> tuple[bool, bool]:
        every = self.cfg.checkpoint_every
        return False, bool(every and step % every == 0)

    def finish(self, model, step: int) -> dict:
        """Save model + processor to ``save_to``; returns the mean loss of the first and last ``k`` steps of this
        run (``k = steps // 5``, 1 to 20) and the number of usable samples."""
        if self.accelerator.is_main_process:
            out = Path(self.cfg.save_to)
            tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
            remove_tree(tmp, ignore_errors=True)
            model.eval().save_pretrained(str(tmp))
            self.processor.save_pretrained(str(tmp))
            remove_tree(out, ignore_errors=True)
            replace_path(tmp, out)
        losses = torch.stack(self.losses).tolist() if self.losses else [float("nan")]
        k = max(1, min(20, self.cfg.steps // 5))
        return {"loss_first": sum(losses[:k]) / len(losses[:k]), "loss_last": sum(losses[-k:]) / len(losses[-k:]),
                "samples": len(self.pairs)}


def pretrain_captioner(cfg: CaptionPretrainConfig, caption_of: Callable | None = None,
                       show_progress: bool = True) -> dict:
    """Run caption pre-training; returns ``{"loss_first", "loss_last", "samples", "cpu_seconds"}``."""
    t0 = time.process_time()
    result = run(CaptionTask(cfg, caption_of, show_progress))
    return {**result, "cpu_seconds": time.process_time() - t0}


__all__ = ["CaptionPretrainConfig", "CaptionTask", "pretrain_captioner"]
