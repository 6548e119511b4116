"""``halsift train clip``: fine-tune an open_clip model on shards, evaluating retrieval and detection in the loop.

:class:`ContrastiveTask` is the CLIP task of :mod:`halsift.training.engine` (which owns the loop, accelerate,
checkpoints and logging); :func:`train` runs it. Runs unchanged under ``python``, ``torchrun`` and ``accelerate
launch`` (gloo on CPU).

Run folder (``cfg.out``), besides the engine's ``config.json``, ``run_info.json``, ``metrics.jsonl`` and
``checkpoints/step_NNNNNN/`` (the full model in ``model.safetensors``)::

    clip_benchmark/step_NNNNNN.json   each in-loop retrieval eval in CLIP_benchmark's result layout
    final/open_clip_model.safetensors   loads with open_clip.create_model_and_transforms(arch, pretrained=PATH)
    final/open_clip_config.json         with the weights, loads in plain open_clip (no halsift, any arch):
                                        open_clip.create_model_and_transforms("local-dir:RUN/final")

Data position on resume: see :mod:`halsift.training.clip_data` (the same stream is rebuilt and the consumed
batches are skipped, exact when world size, workers and batch size are unchanged; otherwise reseeded by step).
"""

from __future__ import annotations

import math
import os
import warnings
from collections import Counter
from pathlib import Path

import torch

from halsift.corpus.shards import ShardFormatError, expand_shards, write_json_atomic
from halsift.corpus.safe_paths import remove_tree, replace_path
from halsift.training.clip_config import ClipTrainConfig, check_model_name, ensure_model_configs
from halsift.training.engine import (NonFiniteLossError, Task, complete_checkpoints, cosine_with_warmup, run,
                                     save_state_dict_safetensors)


# ---------------------------------------------------------------------------------------------- helpers
def build_loss(cfg: ClipTrainConfig, rank: int, world_size: int):
    """``feats -> loss`` with open_clip's ClipLoss (negatives gathered across ranks) or SigLipLoss."""
    from open_clip.loss import ClipLoss, SigLipLoss

    if cfg.loss == "siglip":
        siglip = SigLipLoss(rank=rank, world_size=world_size)
        return lambda f: siglip(f["image_features"], f["text_features"], f["logit_scale"], f["logit_bias"])
    clip = ClipLoss(local_loss=False, gather_with_grad=True, cache_labels=True, rank=rank, world_size=world_size)
    return lambda f: clip(f["image_features"], f["text_features"], f["logit_scale"])


def param_groups(model: torch.nn.Module, wd: float) -> list[dict]:
    """Weight decay on matrices only (open_clip_train's rule: no decay on gains, biases, logit scale)."""
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        exclude = p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n or "logit_bias" in n
        (no_decay if exclude else decay).append(p)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": wd}]


def load_model(arch: str, pretrained: str | None = None, device="cpu", **kw):
    """:func:`halsift.filtering.models.clip_models.load_open_clip` (SigLIP fine-tunes with a stored ``logit_bias``
    load too); a damaged safetensors file is an error naming it as ``pretrained``."""
    from safetensors import SafetensorError

    from halsift.filtering.models.clip_models import load_open_clip

    try:
        return load_open_clip(arch, pretrained, device=device, **kw)
    except SafetensorError as e:
        raise SafetensorError(f"pretrained: {e}") from None


def detection_metrics(model, preprocess, tokenizer, bench: str, work_dir: Path) -> dict:
    """The model scored as a ``clip`` detector on the benchmark: ``auroc/<generator>``, ``auroc/mean`` ...

    Call on every process (the scoring runner splits the bench parts across ranks into ``work_dir``); the
    metrics are computed on the main process (others get ``{}``) and ``work_dir`` is removed afterwards.
    """
    from accelerate import PartialState

    from halsift.eval.runs.bench_eval import bench_frame, join_scores
    from halsift.eval.metrics.detection import auroc_by_generator
    from halsift.filtering.detectors.clip import ClipDetector
    from halsift.filtering.scoring.runner import score_bench

    state = PartialState()
    was_training = model.training
    try:
        detector = ClipDetector.from_model(model, preprocess, tokenizer)  # puts the model in eval mode
        scores = score_bench(detector, bench, out_dir=work_dir, batch_size=64, show_progress=False)
    finally:
        model.train(was_training)
    out: dict = {}
    if state.is_main_process:
        scored, _, _ = join_scores(bench_frame(bench), scores, detector.name)
        out = auroc_by_generator(scored)
        remove_tree(work_dir, ignore_errors=True)
    state.wait_for_everyone()
    return out




# ---------------------------------------------------------------------------------------------- the task
class ContrastiveTask(Task):
    """CLIP / SigLIP contrastive fine-tuning on shards (retrieval and bench detection evaluated in the loop)."""

    desc, unit, rate_key, lr_group = "train clip", "sample", "train/samples_per_s", -1

    def __init__(self, cfg: ClipTrainConfig) -> None:
        cfg.validate()
        check_model_name(cfg.model)
        ensure_model_configs()
        self.cfg, self.workers, self.data_seed, self.skip, self.skipped = cfg, cfg.workers, cfg.seed, 0, 0
        self.skipped_by_kind: Counter = Counter()  # the reader's skip kinds (halsift.corpus.sample)
        self.last_metrics: dict = {}

    def accelerator_kwargs(self) -> dict:
        bf16 = self.cfg.precision == "bf16" or (self.cfg.precision == "auto" and torch.cuda.is_available())
        return {"mixed_precision": "bf16" if bf16 else "no", "gradient_accumulation_steps": self.cfg.grad_accum}

    def setup(self, accelerator) -> dict:
        """Fail on missing or too few shards before the model is built; fewer workers where shards are few."""
        from halsift.training.clip_data import check_selection_complete

        cfg, world = self.cfg, accelerator.num_processes
        self.accelerator, self.out = accelerator, Path(cfg.out)
        n_shards = [len(expand_shards(spec)) for spec in cfg.data]
        for spec in cfg.data:
            check_selection_complete(spec)
        if not cfg.resume and (complete_checkpoints(cfg.out) or (Path(cfg.out) / "final").exists()):
            raise FileExistsError(f"out: {cfg.out} already holds the checkpoints of a run; pass --resume to continue "
                                  "it, or choose another --out")
        if len(n_shards) == 1 and n_shards[0] < world * max(1, cfg.workers):  # one (rank, worker) reader per shard
            if n_shards[0] < world:
                raise ShardFormatError(f"data {cfg.data[0]}: {n_shards[0]} shard(s) cannot be split without "
                                       f"duplicates over {world} processes; write at least {world} shards")
            self.workers = n_shards[0] // world
            warnings.warn(f"data {cfg.data[0]}: {n_shards[0]} shard(s) for {world} process(es): using {self.workers} "
                          f"dataloader worker(s) per process instead of {cfg.workers}", stacklevel=3)
        self.reader_cache = self.cache_bytes(world)
        return {}

    def build(self, accelerator):
        from halsift.filtering.models.clip_tokenizer import get_tokenizer

        cfg = self.cfg
        pretrained = cfg.pretrained or None
        looks_like_path = pretrained and (os.sep in pretrained or pretrained.endswith((".safetensors", ".pt", ".bin")))
        if looks_like_path and not os.path.isfile(pretrained):
            raise FileNotFoundError(f"pretrained: {pretrained} is not a file")
        extra = {"init_logit_bias": -10.0} if cfg.loss == "siglip" else {}  # SigLIP's init (ignored if loaded)
        model, self.preprocess_train, self.preprocess_eval = load_model(cfg.model, pretrained, output_dict=True,
                                                                        **extra)
        self.tokenizer = get_tokenizer(cfg.model)
        if cfg.lock_image:
            model.lock_image_tower(unlocked_groups=0, freeze_bn_stats=True)
        if cfg.lock_text:
            model.lock_text_tower(unlocked_layers=cfg.lock_text_unlocked, freeze_layer_norm=True)
        optimizer, scheduler = cfg.build_optimizer(param_groups(model, cfg.wd), cfg.steps,
                                                   fused=torch.cuda.is_available())  # one kernel on the GPU
        return model, optimizer, scheduler

    def resume(self, state: dict) -> None:
        cfg, start = self.cfg, int(state["step"])
        same_stream = (state.get("world_size"), state.get("workers"), state.get("batch_size"),
                       state.get("grad_accum"), state.get("seed")) == (self.accelerator.num_processes, self.workers,
                                                                        cfg.batch_size, cfg.grad_accum, cfg.seed)
        if same_stream:
            self.skip = start * cfg.grad_accum  # batches this rank consumed; workers fast-forward past them
        else:
            self.data_seed = cfg.seed + start
            warnings.warn(f"resume: world size/workers/batch size/seed changed since step {start}; the data stream "
                          f"is reseeded with seed+step={self.data_seed} instead of replayed", stacklevel=3)

    def batches(self, start: int):
        from halsift.training.clip_data import make_loader

        cfg, acc = self.cfg, self.accelerator
        self.loss_fn = build_loss(cfg, acc.process_index, acc.num_processes)
        loader = make_loader(cfg.data, self.preprocess_train if cfg.augment else self.preprocess_eval,
                             self.tokenizer, cfg.batch_size, weights=cfg.data_weights or None, seed=self.data_seed,
                             workers=self.workers, shuffle_buffer=cfg.shuffle_buffer, skip_batches=self.skip,
                             cache_bytes=self.reader_cache)
        yield from loader

    def cache_bytes(self, world: int) -> int:
        """The decoded-sample cache per data reader (:mod:`~halsift.training.clip_data`): ``cache_mb``, but none with
        ``augment`` (random crops are drawn anew) or when the run reads its data at most once (``sizes.json`` of
        every spec counted: samples per step times steps), where a cache would only hold memory."""
        cfg = self.cfg
        if cfg.augment or not cfg.cache_mb:
            return 0
        from halsift.corpus.shards import read_sizes

        try:
            samples = sum(n for spec in cfg.data for folder in {p.parent for p in expand_shards(spec)}
                          for n in read_sizes(folder).values())
        except ShardFormatError:  # no sizes.json: the count is unknown, the cache kept
            samples = 0
        if samples and cfg.steps * cfg.batch_size * cfg.grad_accum * world <= samples:
            return 0
        return cfg.cache_mb << 20

    def loss(self, model, batch) -> torch.Tensor:
        device = self.accelerator.device
        self.skipped += int(batch["skipped"])
        self.skipped_by_kind.update({k: int(v) for k, v in batch["skipped_by_kind"].items()})
        images = batch["image"].to(device, non_blocking=True)
        texts = batch["text"].to(device, non_blocking=True)
        return self.loss_fn(model(images, texts))

    def after_step(self, model) -> None:
        with torch.no_grad():  # open_clip_train clamps the temperature to 100
            model.logit_scale.clamp_(0, math.log(100))

    def log_values(self, model) -> dict:
        return {"train/logit_scale": float(model.logit_scale.detach().exp()), "train/skipped_samples": self.skipped,
                **{f"train/skipped/{k}": n for k, n in sorted(self.skipped_by_kind.items())}}

    def due(self, step: int) -> tuple[bool, bool]:
        cfg, last = self.cfg, step == self.cfg.steps
        return (bool(cfg.eval_every) and step % cfg.eval_every == 0) or last, \
            (bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0) or last

    def evaluate(self, model, step: int) -> tuple[dict, bool]:
        """Retrieval (main process) and bench detection (all processes share the scoring), logged together."""
        from halsift.eval.metrics.retrieval import evaluate_retrieval, retrieval_set_name, write_clip_benchmark

        cfg, acc, out = self.cfg, self.accelerator, self.out
        unwrapped = acc.unwrap_model(model)
        acc.wait_for_everyone()
        metrics: dict = {}
        if cfg.bench:
            metrics.update(detection_metrics(unwrapped, self.preprocess_eval, self.tokenizer, cfg.bench,
                                             out / "eval_tmp" / f"bench_step_{step:06d}"))
        if cfg.retrieval and acc.is_main_process:
            rm = evaluate_retrieval(unwrapped, self.preprocess_eval, self.tokenizer, cfg.retrieval, acc.device,
                                    cfg.eval_batch_size, precision=cfg.precision)
            metrics.update(rm)
            write_clip_benchmark(out / "clip_benchmark" / f"step_{step:06d}.json", rm,
                                 retrieval_set_name(cfg.retrieval), cfg.model, f"{out.name}@step{step}")
        acc.wait_for_everyone()
        self.last_metrics = metrics
        return metrics, False

    def state(self, step: int) -> dict:
        cfg, world = self.cfg, self.accelerator.num_processes
        return {"world_size": world, "workers": self.workers, "batch_size": cfg.batch_size,
                "grad_accum": cfg.grad_accum, "seed": cfg.seed, "model": cfg.model,
                "samples_seen": step * cfg.batch_size * cfg.grad_accum * world}

    def finish(self, model, step: int) -> dict:
        """``final/``: an open_clip ``local-dir:`` folder (weights + ``open_clip_config.json``) and the last
        evaluation; returns those metrics."""
        from halsift.training.open_clip_folder import write_open_clip_folder

        if self.accelerator.is_main_process:
            final_dir, tmp = self.out / "final", self.out / f".final.tmp-{os.getpid()}"
            remove_tree(tmp, ignore_errors=True)
            tmp.mkdir()
            write_open_clip_folder(model, self.cfg.model, tmp, self.tokenizer)
            write_json_atomic(tmp / "config.json", {"model": self.cfg.model, "step": step,
                                                    "metrics": self.last_metrics})
            remove_tree(final_dir, ignore_errors=True)
            replace_path(tmp, final_dir)
        return self.last_metrics


def train(cfg: ClipTrainConfig) -> dict:
    """Run (or resume) CLIP training; returns the final evaluation metrics (empty without eval sets)."""
    return run(ContrastiveTask(cfg))


__all__ = ["ContrastiveTask", "NonFiniteLossError", "build_loss", "cosine_with_warmup", "detection_metrics",
           "load_model", "param_groups", "save_state_dict_safetensors", "train"]
