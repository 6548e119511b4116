"""``halsift train detector``: LoRA fine-tuning of a ``clip`` or ``vlm`` detector on an annotated bench.

:class:`DetectorTask` is the detector task of :mod:`halsift.training.engine` (val AUROC every ``eval_every`` steps,
early stopping, export of the best adapter); :func:`train_detector` runs it. Runs unchanged under ``python``,
``torchrun`` and ``accelerate launch`` (gloo on CPU). Rows labelled ``unknown`` are left out; rows of
``train_split`` train, rows of ``val_split`` pick the best step.

Run folder (``cfg.out``)::

    config.json, run_info.json, metrics.jsonl    resolved config, world size, one JSON line per log/eval
    checkpoints/step_NNNNNN/   the engine's checkpoint; model.safetensors holds only the trainable weights
    best/                      the adapter of the best val AUROC so far (replaced atomically on improvement)
    adapter/                   the exported detector (= best/, or the last step without validation):
                               adapter_model.safetensors + adapter_config.json (peft), head.safetensors (clip),
                               detector.yaml (kind, base spec, mode, step, val AUROC)  -> spec ``lora:OUT/adapter``
    adapter/merged/            with ``merge``: the adapter merged into the base weights (also ``lora:`` loadable)

Batches are drawn per step from ``(seed, step)``, so a resumed run sees exactly the batches a straight run would.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from halsift.corpus.bench import BenchFormatError
from halsift.corpus.images import SkipCounter
from halsift.corpus.parent_watch import ExitWithParent
from halsift.corpus.shards import write_json_atomic
from halsift.corpus.safe_paths import remove_tree, replace_path
from halsift.filtering.detectors.base import Item
from halsift.filtering.models.lora_adapters import FORMAT as EXPORT_FORMAT  # the adapter folder's format tag
from halsift.training.detector_config import DetectorTrainConfig
from halsift.training.engine import Task, run


# ---------------------------------------------------------------------------------------------- data
@functools.lru_cache(maxsize=4096)
def _load_image(path: str):
    from halsift.corpus.images import load_image_file

    return load_image_file(path)


def bench_examples(bench: str | os.PathLike, split: str) -> list[tuple[Any, int]]:
    """``(BenchRow, label)`` for the labelled rows of ``split`` (1 = correct, 0 = incorrect; unknown left out)."""
    from halsift.corpus.bench import read_bench

    return [(r, int(r.label == "correct")) for r in read_bench(bench) if r.split == split and r.label != "unknown"]


def row_items(bench: str | os.PathLike, rows: list) -> list[Item]:
    """Items of ``rows`` (:func:`~halsift.corpus.sample.bench_items`: the caption's earlier sentences as context;
    images decoded lazily on first use, from ``meta["image_path"]``)."""
    import dataclasses

    from halsift.corpus.bench import read_bench
    from halsift.corpus.sample import bench_items

    by_caption: dict[str, list] = {}
    for r in read_bench(bench):
        by_caption.setdefault(r.caption_id, []).append(r)
    items = {it.key: it for caption in by_caption.values() for it in bench_items(caption)}
    root = Path(bench).parent
    return [dataclasses.replace(items[r.id], meta={**items[r.id].meta, "image_path": str(root / r.image)})
            for r in rows]


def readable_items(items: list[Item], labels: np.ndarray, skipped) -> tuple[list[Item], np.ndarray]:
    """Leave out the rows whose image cannot be read (missing, not a regular file, undecodable), counting each in
    ``skipped`` (a :class:`~halsift.corpus.images.SkipCounter`), as ``score`` skips the same rows."""
    from halsift.corpus.images import ImageDecodeError

    keep = []
    for i, it in enumerate(items):
        path = Path(it.meta["image_path"])
        try:
            _load_image(str(path))
            keep.append(i)
        except ImageDecodeError as e:
            skipped.add(it.key, f"image {path}: {e.reason}", e.kind)
    return [items[i] for i in keep], labels[keep]


def with_image(it: Item) -> Item:
    if it.image is None:
        it.image = _load_image(it.meta["image_path"])
    return it


class StepBatches:
    """Index lists of one process for steps ``start..steps-1``; step ``s``'s global batch depends on (seed, s) only.

    ``balance=sample`` draws each class with probability 1/2; otherwise rows are drawn uniformly without
    replacement within a step. The global batch is ``batch_size * world`` rows; rank ``r`` takes every
    ``world``-th one.
    """

    def __init__(self, labels: np.ndarray, batch_size: int, seed: int, start: int, steps: int, rank: int,
                 world: int, balance: str) -> None:
        self.labels, self.bs, self.seed = labels, batch_size, seed
        self.start, self.steps, self.rank, self.world, self.balance = start, steps, rank, world, balance
        p = np.ones(len(labels))
        if balance == "sample":
            for c in (0, 1):
                p[labels == c] = 0.5 / max(1, int((labels == c).sum()))
        self.p = p / p.sum()

    def __len__(self) -> int:
        return max(0, self.steps - self.start)

    def __iter__(self):
        g = self.bs * self.world
        for s in range(self.start, self.steps):
            rng = np.random.default_rng([self.seed, s])
            idx = rng.choice(len(self.labels), size=g, replace=self.balance == "sample" or g > len(self.labels),
                             p=self.p)
            yield idx[self.rank::self.world].tolist()


class _Examples(torch.utils.data.Dataset):
    def __init__(self, items: list[Item], labels: np.ndarray) -> None:
        self.items, self.labels = items, labels

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Item, int]:
        return with_image(self.items[i]), int(self.labels[i])


# ---------------------------------------------------------------------------------------------- tasks
def build_task(cfg: DetectorTrainConfig):
    """The kind-specific half of a run: ``.module`` (trainable nn.Module), ``.collate``, ``.forward(module, batch)``
    -> logits, ``.detector(module)``, ``.export(dir)``, ``.export_merged(dir)``."""
    kind = cfg.resolved_kind()
    if kind == "clip":
        from halsift.training.lora_clip import ClipTask

        return ClipTask(cfg)
    from halsift.training.lora_vlm import VlmTask

    return VlmTask(cfg)


def _export(task, out: Path, name: str, meta: dict) -> Path:
    """Write the adapter folder ``out/name`` atomically (temp folder + rename)."""
    from halsift.filtering.models.lora_adapters import write_description

    final = out / name
    tmp = out / f".{name}.tmp-{os.getpid()}"
    remove_tree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    desc = task.export(tmp)
    write_description(tmp, {**desc, **meta})
    old = out / f".{name}.old-{os.getpid()}"
    if final.exists():
        replace_path(final, old)
    replace_path(tmp, final)
    remove_tree(old, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------- eval
def val_auroc(detector, items: list[Item], labels: np.ndarray, batch_size: int, rank: int, world: int) -> dict:
    """Pooled and per-generator-mean AUROC (0-100) of ``detector`` on the val items, scored across ranks."""
    import pandas as pd
    from accelerate.utils import gather_object

    from halsift.eval.metrics.detection import MetricError, auroc, auroc_by_generator

    mine = list(range(rank, len(items), world))
    scores: list[tuple[int, float]] = []
    for s in range(0, len(mine), batch_size):
        chunk = mine[s:s + batch_size]
        res = detector.score_batch([with_image(items[i]) for i in chunk])
        scores += [(i, r.score) for i, r in zip(chunk, res)]
    if world > 1:
        scores = gather_object(scores)
    score = np.full(len(items), np.nan)
    for i, v in scores:
        score[i] = v
    try:
        pooled = auroc(labels, score)
    except MetricError:
        return {}
    df = pd.DataFrame({"generator": [it.meta["captioner"] for it in items],
                       "generator_type": [it.meta["source"] for it in items],
                       "label": np.where(labels == 1, "correct", "incorrect"), "score": score})
    by_gen = auroc_by_generator(df)
    return {"val/auroc": pooled, **({"val/auroc_mean": by_gen["mean"]} if "mean" in by_gen else {})}


# ---------------------------------------------------------------------------------------------- the task
class DetectorTask(Task):
    """LoRA fine-tuning of a ``clip`` or ``vlm`` detector: binary cross-entropy of its score on bench rows, val
    AUROC every ``eval_every`` steps (and at step 0: the base), early stopping, the best adapter exported."""

    unit, rate_key = "sent", "train/sentences_per_s"

    def __init__(self, cfg: DetectorTrainConfig) -> None:
        cfg.validate()
        self.cfg, self.kind = cfg, cfg.resolved_kind()
        if not Path(cfg.bench).is_file():
            raise FileNotFoundError(f"bench: {cfg.bench} does not exist")
        self.desc, self.out = f"train detector ({self.kind})", Path(cfg.out)
        self.progress = {"best_auroc": None, "best_step": 0, "bad_evals": 0, "stopped_early": False}

    @property
    def stopped(self) -> bool:
        return self.progress["stopped_early"]

    def setup(self, accelerator) -> dict:
        """The labelled train/val rows whose images are readable (the others skipped and counted)."""
        cfg = self.cfg
        self.accelerator = accelerator
        train_rows = bench_examples(cfg.bench, cfg.train_split)
        val_rows = bench_examples(cfg.bench, cfg.val_split) if cfg.val_split else []
        if cfg.max_val_rows:
            val_rows = val_rows[:cfg.max_val_rows]
        skipped = SkipCounter(max_examples=1000)
        self.train_items, self.y_train = readable_items(row_items(cfg.bench, [r for r, _ in train_rows]),
                                                        np.array([y for _, y in train_rows], dtype=np.int64), skipped)
        self.val_items, self.y_val = readable_items(row_items(cfg.bench, [r for r, _ in val_rows]),
                                                    np.array([y for _, y in val_rows], dtype=np.int64), skipped)
        y = self.y_train
        if len(set(y.tolist())) < 2:
            raise BenchFormatError(f"bench {cfg.bench}: split {cfg.train_split!r} needs correct and incorrect rows "
                                   f"with readable images, has {int(y.sum())} correct of {len(y)} usable labelled "
                                   f"rows ({skipped.summary()})")
        if skipped.total:
            warnings.warn(f"bench {cfg.bench}: {skipped.summary()} rows with unreadable images left out", stacklevel=3)
        return {"kind": self.kind, "train_rows": len(self.train_items), "val_rows": len(self.val_items),
                "skipped": skipped.to_json()}

    def build(self, accelerator):
        cfg, y = self.cfg, self.y_train
        self.task = build_task(cfg)
        module = self.task.module.to(accelerator.device)
        optimizer, scheduler = cfg.build_optimizer(self.task.param_groups(cfg), cfg.steps)
        n_pos = int(y.sum())
        self.class_w = (torch.tensor([len(y) / (2 * (len(y) - n_pos)), len(y) / (2 * n_pos)])
                        if cfg.balance == "loss" else torch.ones(2))
        return module, optimizer, scheduler

    def resume(self, state: dict) -> None:
        self.progress.update({k: state[k] for k in self.progress if k in state})

    def batches(self, start: int):
        acc, cfg = self.accelerator, self.cfg
        sampler = StepBatches(self.y_train, cfg.batch_size, cfg.seed, start, cfg.steps, acc.process_index,
                              acc.num_processes, cfg.balance)
        yield from torch.utils.data.DataLoader(_Examples(self.train_items, self.y_train), batch_sampler=sampler,
                                               collate_fn=self.task.collate, num_workers=cfg.workers,
                                               worker_init_fn=ExitWithParent())

    def begin(self, model, start: int) -> bool:
        self.t0 = time.perf_counter()
        return start == 0 and bool(len(self.val_items)) and not self.stopped  # the base detector's val AUROC

    def loss(self, model, batch) -> torch.Tensor:
        labels = batch.pop("labels").to(self.accelerator.device)
        logits = self.task.forward(model, batch, self.accelerator.device)
        w = self.class_w.to(labels.device)[labels.long()]
        return torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels, weight=w)

    def due(self, step: int) -> tuple[bool, bool]:
        evals = step % self.cfg.eval_every == 0 or step == self.cfg.steps
        return evals, evals or bool(self.cfg.checkpoint_every and step % self.cfg.checkpoint_every == 0)

    def evaluate(self, model, step: int) -> tuple[dict, bool]:
        """Val AUROC; ``best/`` exported on improvement; stop after ``patience`` evaluations without one."""
        cfg, acc, state = self.cfg, self.accelerator, self.progress
        if step:  # step 0 scores the base as the loop left it
            model.eval()
        metrics = val_auroc(self.task.detector(acc.unwrap_model(model)), self.val_items, self.y_val,
                            cfg.eval_batch_size, acc.process_index, acc.num_processes) if len(self.val_items) else {}
        if step:
            model.train()
        auc = metrics.get("val/auroc")
        if auc is not None and (state["best_auroc"] is None or auc > state["best_auroc"]):
            state.update(best_auroc=auc, best_step=step, bad_evals=0)
            if acc.is_main_process:
                _export(self.task, self.out, "best", {"step": step, "val_auroc": round(auc, 4)})
        elif auc is not None:
            state["bad_evals"] += 1
        stop = bool(cfg.patience and state["bad_evals"] >= cfg.patience)
        if step:  # (the engine ignores ``stop`` at step 0)
            state["stopped_early"] = stop
        if stop and step:
            acc.print(f"early stop at step {step}: no better val AUROC in {cfg.patience} evaluations "
                      f"(best {state['best_auroc']:.2f} at step {state['best_step']})")
        return {**metrics, "val/best_auroc": state["best_auroc"] or float("nan")}, stop

    def state(self, step: int) -> dict:
        return {"world_size": self.accelerator.num_processes, "batch_size": self.cfg.batch_size, "seed": self.cfg.seed,
                **self.progress}

    def weights(self, model) -> dict[str, torch.Tensor]:
        """Only the trainable parameters (the frozen base is not saved)."""
        return {n: p for n, p in model.named_parameters() if p.requires_grad}

    def load_weights(self, model, state: dict[str, torch.Tensor]) -> None:
        want = set(self.weights(model))
        if set(state) != want:
            raise ValueError(f"checkpoint does not match the model's trainable parameters "
                             f"(missing {sorted(want - set(state))[:3]}, unexpected {sorted(set(state) - want)[:3]})")
        model.load_state_dict(state, strict=False)

    def finish(self, model, step: int) -> dict:
        """``adapter/``: the best adapter (or the last one without validation), merged too with ``merge``."""
        acc, out, state = self.accelerator, self.out, self.progress
        result = {"kind": self.kind, "last_step": step, "best_step": state["best_step"],
                  "val/auroc": state["best_auroc"], "train_seconds": time.perf_counter() - self.t0}
        acc.wait_for_everyone()
        if acc.is_main_process:
            if state["best_auroc"] is None or not (out / "best").is_dir():
                _export(self.task, out, "best", {"step": step, "val_auroc": None})
            final, tmp = out / "adapter", out / f".adapter.tmp-{os.getpid()}"
            remove_tree(tmp, ignore_errors=True)
            shutil.copytree(out / "best", tmp)
            if self.cfg.merge:
                self.task.load_export(tmp)  # merge the best adapter, not the last one
                self.task.export_merged(tmp / "merged")
            remove_tree(final, ignore_errors=True)
            replace_path(tmp, final)
            write_json_atomic(out / "result.json", {**result, "adapter": str(final.resolve())})
        acc.wait_for_everyone()
        return {**result, "adapter": str((out / "adapter").resolve())}


def train_detector(cfg: DetectorTrainConfig) -> dict:
    """Run (or resume) LoRA fine-tuning; returns ``{"adapter": path, "best_step", "val/auroc", ...}``."""
    return run(DetectorTask(cfg))


__all__ = ["DetectorTask", "EXPORT_FORMAT", "StepBatches", "bench_examples", "row_items",
           "train_detector", "val_auroc"]
