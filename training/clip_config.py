"""Typed config of ``halsift train clip``; field help strings become ``--help`` and YAML comments.

Validation lives in :meth:`ClipTrainConfig.validate`; unknown YAML keys are rejected by
``halsift.corpus.config.from_dict``. The built-in tiny architecture ``halsift-tiny`` (for tests and CPU runs;
shipped with the clip detector in ``filtering/models/model_configs``) is registered by :func:`ensure_model_configs`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from halsift.corpus.config import WandbMode
from halsift.corpus.config import field as _f
from halsift.training.optimizer_config import optimizer_section


ClipOptimizer = optimizer_section(
    "ClipOptimizer", lr=5e-5, wd=0.1, beta1=0.9, beta2=0.98, eps=1e-6, warmup=10, fixed={"schedule": "cosine"},
    help={"wd": "weight decay (not applied to gains, biases, logit scale)",
          "warmup": "linear warmup steps, then cosine decay to 0"})


@dataclasses.dataclass
class ClipTrainConfig(ClipOptimizer):
    """Everything one CLIP fine-tuning run needs; saved as ``config.json`` in the run folder."""

    data: list[str] = _f(default_factory=list, help="shard specs: folder, glob or brace pattern (one per source)")
    data_weights: list[float] = _f(default_factory=list, range="(0, inf)",
                                   help="mixture weight per data spec (several specs: resampled mixture)")
    out: str = _f("", help="run folder: checkpoints/, final/, metrics.jsonl, config.json")
    model: str = _f("ViT-B-32", help="open_clip architecture (open_clip.list_models()); halsift-tiny: a built-in "
                                     "2-layer model for tests and CPU smoke runs")
    pretrained: str = _f("", help="open_clip pretrained tag, a local weights file, or '' for random init")
    loss: str = _f("clip", help="clip (softmax InfoNCE) or siglip (sigmoid)")
    steps: int = _f(100, range="[1, inf)", help="optimizer steps")
    batch_size: int = _f(64, range="[1, inf)", help="samples per micro-batch per process")
    grad_accum: int = _f(1, range="[1, inf)",
                         help="micro-batches per optimizer step (negatives stay within a micro-batch)")
    grad_clip: float = _f(1.0, range="[0, inf)", help="max gradient norm (0 = off)")
    precision: str = _f("auto", help="auto (bf16 autocast on GPU, fp32 on CPU) | bf16 | fp32")
    lock_image: bool = _f(False, help="freeze the image tower")
    lock_text: bool = _f(False, help="freeze the text tower except its last lock_text_unlocked layers")
    lock_text_unlocked: int = _f(0, range="[0, inf)", help="text layers left trainable when lock_text is set")
    augment: bool = _f(False, help="train with open_clip's random-resized-crop transform instead of the eval one")
    workers: int = _f(2, range="[0, inf)", help="dataloader workers per process (0 = in the main process)")
    shuffle_buffer: int = _f(256, range="[0, inf)", help="sample shuffle buffer per worker (0 = off)")
    cache_mb: int = _f(1024, range="[0, inf)",
                       help="keep decoded, preprocessed samples of whole shards in memory for later epochs, up to this "
                            "many MB per data reader (0 = off; not with augment, nor when the run reads its data at most "
                            "once). Changes speed only, never the batches")
    checkpoint_every: int = _f(0, range="[0, inf)", help="save a checkpoint every N steps (0 = only at the end)")
    keep_checkpoints: int = _f(0, range="[0, inf)", help="keep only the newest K step checkpoints (0 = keep all)")
    eval_every: int = _f(0, range="[0, inf)", help="evaluate every N steps (0 = only at the end)")
    retrieval: str = _f("", help="retrieval set (retrieval.jsonl or its folder) evaluated in the loop")
    bench: str = _f("", help="benchmark bench.jsonl: the model's own detection AUROC, evaluated in the loop")
    eval_batch_size: int = _f(64, range="[1, inf)", help="batch size for evaluation")
    log_every: int = _f(10, range="[1, inf)", help="write a metrics.jsonl line every N steps (the loss is read from "
                                                   "the device only then: no host sync on the other steps)")
    wandb_project: str = _f("halsift", help="wandb project")
    wandb_run: str = _f("", help="wandb run name ('' = the run folder's name)")
    wandb_mode: WandbMode = _f("offline", help="wandb mode: offline | online | disabled")
    seed: int = _f(0, range="[0, inf)", help="seed for init, shard order and sample shuffling")
    resume: bool = _f(False, help="continue from the newest complete checkpoint in out/checkpoints")

    def validate(self) -> None:
        """Raise ValueError naming the field on a bad value."""
        if not self.data:
            raise ValueError("data: at least one shard spec is required")
        if self.data_weights and len(self.data_weights) != len(self.data):
            raise ValueError(f"data_weights: {len(self.data_weights)} weights for {len(self.data)} data specs")
        if not self.out:
            raise ValueError("out: a run folder is required")
        if self.loss not in ("clip", "siglip"):
            raise ValueError(f"loss: expected clip or siglip, got {self.loss!r}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision: expected auto, bf16 or fp32, got {self.precision!r}")
        self.check_optimizer()  # and every declared range (steps, batch sizes, intervals, grad_clip ...)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def ensure_model_configs() -> None:
    """Make halsift's built-in open_clip configs (``halsift-tiny``) known to open_clip."""
    from halsift.filtering.models.clip_models import register_builtin_configs

    register_builtin_configs()


def _packaged_model_names() -> set[str]:
    """open_clip's architecture names read from its packaged ``model_configs/*.json`` plus halsift's own, without
    importing open_clip (and torch): the dry run's fast path. Empty when open_clip's files cannot be found."""
    import importlib.util

    from halsift.filtering.models.clip_models import _CONFIG_DIR

    spec = importlib.util.find_spec("open_clip")
    roots = [Path(d) / "model_configs" for d in (spec.submodule_search_locations or [])] if spec else []
    return {f.stem for root in [*roots, Path(_CONFIG_DIR)] if root.is_dir() for f in root.glob("*.json")}


def check_model_name(name: str) -> None:
    """Raise ValueError when ``name`` is not an open_clip architecture (after registering ours).

    A name among open_clip's packaged configs answers without importing open_clip; anything else (a config
    registered at run time, a typo) asks open_clip itself."""
    if name.startswith(("hf-hub:", "local-dir:")) or name in _packaged_model_names():
        return
    import open_clip

    ensure_model_configs()
    if name not in open_clip.list_models():
        close = [m for m in open_clip.list_models() if name.lower()[:4] in m.lower()][:5]
        raise ValueError(f"model: {name!r} is not an open_clip architecture"
                         + (f" (close: {', '.join(close)})" if close else "; see open_clip.list_models()"))
