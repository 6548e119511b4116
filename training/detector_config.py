"""Typed config of ``halsift train detector``; field help strings become ``--help`` and YAML comments.

One config drives both detector kinds: ``kind=clip`` (LoRA on both open_clip towers + a small binary head on
``[cosine, image*text]``) and ``kind=vlm`` (LoRA on a transformers VLM judge, trained so that its own score,
``P(yes)`` or the expected 0-100 number, separates correct from incorrect sentences). ``kind=auto`` takes the
family of the ``base`` spec. Validation lives in :meth:`DetectorTrainConfig.validate`.
"""

from __future__ import annotations

import dataclasses
import os

from halsift.corpus.config import WandbMode
from halsift.corpus.config import field as _f
from halsift.training.optimizer_config import optimizer_section

KINDS = ("auto", "clip", "vlm")
BALANCE = ("loss", "sample", "none")
# open_clip blocks: nn.MultiheadAttention "attn" (peft wraps in_proj and out_proj together) and the MLP linears
CLIP_TARGETS = ["attn", "c_fc", "c_proj"]
# transformers decoders (Llama / Qwen2 / Gemma naming): attention and MLP projections of the language model
VLM_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


DetectorOptimizer = optimizer_section(
    "DetectorOptimizer", lr=1e-3, wd=0.0, warmup=10, fixed={"schedule": "cosine"},
    help={"lr": "peak learning rate of the adapter (AdamW)", "warmup": "linear warmup steps, then cosine decay to 0"})


@dataclasses.dataclass
class DetectorTrainConfig(DetectorOptimizer):
    """Everything one detector fine-tuning run needs; saved as ``config.json`` in the run folder."""

    base: str = _f("", help="base detector spec: clip:arch=...,checkpoint=... or vlm:model=DIR,mode=yes_prob|logits")
    bench: str = _f("", help="annotated bench.jsonl; rows of train_split train, rows of val_split select the best step")
    out: str = _f("", help="run folder: adapter/ (the lora:DIR detector), checkpoints/, metrics.jsonl, config.json")
    kind: str = _f("auto", help="auto (from the base spec's family) | clip | vlm")
    target_modules: list[str] = _f(default_factory=list,
                                   help="module names LoRA adapts ([] = attn,c_fc,c_proj for clip; "
                                        "q/k/v/o/gate/up/down_proj for vlm)")
    modules_to_save: list[str] = _f(default_factory=list,
                                    help="modules trained in full next to LoRA (vlm: e.g. multi_modal_projector)")
    lora_r: int = _f(8, range="[1, inf)", help="LoRA rank")
    lora_alpha: float = _f(16.0, range="[0, inf)", help="LoRA alpha (scale = alpha / r)")
    lora_dropout: float = _f(0.0, range="[0, 1)", help="dropout on the LoRA input")
    head_hidden: int = _f(64, range="[0, inf)",
                          help="clip: hidden width of the head on [cosine, image*text] (0 = linear head)")
    head_lr: float = _f(0.0, range="[0, inf)", help="clip: learning rate of the head (0 = same as lr)")
    steps: int = _f(200, range="[1, inf)", help="optimizer steps (at most)")
    batch_size: int = _f(32, range="[1, inf)", help="sentences per batch per process")
    grad_clip: float = _f(1.0, range="[0, inf)", help="max gradient norm (0 = off)")
    balance: str = _f("loss", help="class balance: loss (weight each class by half its inverse frequency) | "
                                   "sample (class-balanced sampling) | none")
    train_split: str = _f("train", help="bench split used for training")
    val_split: str = _f("val", help="bench split used for early stopping ('' = no validation, keep the last step)")
    max_val_rows: int = _f(0, range="[0, inf)", help="evaluate on at most this many val rows (0 = all)")
    eval_every: int = _f(50, range="[1, inf)", help="evaluate val AUROC every N steps (and at the end)")
    patience: int = _f(3, range="[0, inf)",
                       help="stop after this many evaluations without a better val AUROC (0 = never stop early)")
    checkpoint_every: int = _f(0, range="[0, inf)",
                               help="save a resumable checkpoint every N steps (0 = only with evaluations)")
    keep_checkpoints: int = _f(2, range="[0, inf)", help="keep the newest K step checkpoints (0 = all)")
    merge: bool = _f(False, help="also write merged/: the adapter merged into the base weights")
    mode: str = _f("", help="vlm: judge mode trained and scored (yes_prob | logits; '' = the base spec's, else yes_prob)")
    eval_batch_size: int = _f(64, range="[1, inf)", help="batch size for validation scoring")
    workers: int = _f(0, range="[0, inf)", help="dataloader workers per process")
    log_every: int = _f(10, range="[1, inf)", help="write a metrics.jsonl line every N steps")
    wandb_project: str = _f("halsift", help="wandb project")
    wandb_run: str = _f("", help="wandb run name ('' = the run folder's name)")
    wandb_mode: WandbMode = _f("offline", help="wandb mode: offline | online | disabled")
    teacher: str = _f("", help="distil instead: a score folder of a judge on a uniform sample of the corpus (not "
                               "a cascade's _stages/sample, whose unsampled units hold placeholder scores) whose "
                               "scores a student head on --embeddings learns; no bench, no base, no labels")
    embeddings: str = _f("", help="with --teacher: a `halsift embed` folder of the shards the teacher scored")
    teacher_sample: int = _f(0, range="[0, inf)",
                             help="with --teacher: train on at most this many of its units, drawn uniformly "
                                  "(0 = all)")
    seed: int = _f(0, range="[0, inf)", help="seed for LoRA/head init and batch order")
    resume: bool = _f(False, help="continue from the newest complete checkpoint in out/checkpoints")

    def validate(self) -> None:
        """Raise ValueError naming the field on a bad value."""
        for name in ("embeddings", "out") if self.teacher else ("base", "bench", "out"):
            if not getattr(self, name):
                raise ValueError(f"{name}: required" + (" with --teacher" if self.teacher else ""))
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")
        if self.balance not in BALANCE:
            raise ValueError(f"balance: expected one of {BALANCE}, got {self.balance!r}")
        if self.mode not in ("", "yes_prob", "logits"):
            raise ValueError(f"mode: expected yes_prob or logits (or '' for the base spec's), got {self.mode!r}")
        if self.train_split == self.val_split:
            raise ValueError(f"val_split: must differ from train_split ({self.train_split!r})")
        self.check_optimizer()  # and every declared range (lora_r, steps, batch sizes, dropout, intervals ...)

    def resolved_kind(self) -> str:
        """``clip`` or ``vlm``: ``kind``, or the base spec's family when ``kind=auto``."""
        if self.teacher:
            return "student"
        if self.kind != "auto":
            return self.kind
        family = self.base.split(":", 1)[0].strip()
        if family not in ("clip", "vlm"):
            raise ValueError(f"base: family {family!r} cannot be LoRA-tuned; expected a clip:... or vlm:... spec")
        return family

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


__all__ = ["BALANCE", "CLIP_TARGETS", "KINDS", "VLM_TARGETS", "DetectorTrainConfig"]


def absolute_spec(spec: str, keys=("checkpoint", "model", "pretrained")) -> str:
    """The base spec with its local paths made absolute (so ``detector.yaml`` works from any directory)."""
    from halsift.filtering.detectors.spec import format_spec, parse_spec

    family, opts = parse_spec(spec)
    for k in keys:
        v = opts.get(k)
        if isinstance(v, str) and v and os.path.exists(v):
            opts[k] = os.path.abspath(v)
    return format_spec(family, opts)
