"""``halsift train detector``: LoRA fine-tuning of a ``clip`` or ``vlm`` detector on an annotated bench.

Reads top to bottom: setup -> train (val AUROC every ``eval_every`` steps, early stopping) -> export -> cleanup.
Runs unchanged under ``python``, ``torchrun`` and ``accelerate launch`` (gloo on CPU). Rows labelled ``unknown``
are left out; rows of ``train_split`` train, rows of ``val_split`` pick the best step.

Run folder (``cfg.out``)::

    config.json, run_info.json, metrics.jsonl    resolved config, world size, one JSON line per log/eval
    checkpoints/step_NNNNNN/   trainable weights (model.safetensors), optimizer.pt, scheduler.pt, rng.pt, state.json
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
from halsift.corpus.progress import progress
from halsift.corpus.shards import write_json_atomic
from halsift.filtering.base import Item
from halsift.training.clip_train import (MetricsLog, NonFiniteWatch, complete_checkpoints, cosine_with_warmup,
                                         load_checkpoint, save_checkpoint)
from halsift.training.detector_config import DetectorTrainConfig

EXPORT_FORMAT = "halsift-lora-detector/1"


# ---------------------------------------------------------------------------------------------- data
@functools.lru_cache(maxsize=4096)
def _load_image(path: str):
    from halsift.corpus.images import decode_image

    return decode_image(Path(path).read_bytes(), path)


def bench_examples(bench: str | os.PathLike, split: str) -> list[tuple[Any, int]]:
    """``(BenchRow, label)`` for the labelled rows of ``split`` (1 = correct, 0 = incorrect; unknown left out)."""
    from halsift.corpus.bench import read_bench

    return [(r, int(r.label == "correct")) for r in read_bench(bench) if r.split == split and r.label != "unknown"]


def row_items(bench: str | os.PathLike, rows: list) -> list[Item]:
    """Items (with the caption's preceding sentences as context, images decoded lazily on first use)."""
    from halsift.corpus.bench import read_bench

    by_caption: dict[str, dict[int, str]] = {}
    for r in read_bench(bench):
        by_caption.setdefault(r.caption_id, {})[r.position] = r.sentence
    root = Path(bench).parent
    out = []
    for r in rows:
        sents = by_caption[r.caption_id]
        ctx = [sents[p] for p in sorted(sents) if p < r.position]
        out.append(Item(r.id, r.position, r.sentence, ctx, None, r.image_id,
                        {"captioner": r.generator, "source": r.generator_type, "label": r.label,
                         "image_path": str(root / r.image)}))
    return out


def readable_items(items: list[Item], labels: np.ndarray, skipped) -> tuple[list[Item], np.ndarray]:
    """Leave out the rows whose image cannot be read (missing, not a regular file, undecodable), counting each in
    ``skipped`` (a :class:`~halsift.corpus.images.SkipCounter`), as ``score`` skips the same rows."""
    from halsift.corpus.images import ImageDecodeError

    keep = []
    for i, it in enumerate(items):
        path = Path(it.meta["image_path"])
        try:
            if not path.is_file():
                raise OSError(f"{path} is missing or not a regular file")
            _load_image(str(path))
            keep.append(i)
        except ImageDecodeError as e:
            skipped.add(it.key, f"image {path}: {e.reason}", e.kind)
        except OSError as e:
            skipped.add(it.key, f"image {path}: {e}", "missing_image")
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


class TrainableView:
    """The trainable parameters of a module as a state dict (what checkpoints hold; the frozen base is not saved)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict:
        return {n: p for n, p in self.module.named_parameters() if p.requires_grad}

    def load_state_dict(self, state: dict) -> None:
        want = set(self.state_dict())
        if set(state) != want:
            raise ValueError(f"checkpoint does not match the model's trainable parameters "
                             f"(missing {sorted(want - set(state))[:3]}, unexpected {sorted(set(state) - want)[:3]})")
        self.module.load_state_dict(state, strict=False)


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


def absolute_spec(spec: str, keys=("checkpoint", "model", "pretrained")) -> str:
    """The base spec with its local paths made absolute (so ``detector.yaml`` works from any directory)."""
    from halsift.filtering.spec import format_spec, parse_spec

    family, opts = parse_spec(spec)
    for k in keys:
        v = opts.get(k)
        if isinstance(v, str) and v and os.path.exists(v):
            opts[k] = os.path.abspath(v)
    return format_spec(family, opts)


def _export(task, out: Path, name: str, meta: dict) -> Path:
    """Write the adapter folder ``out/name`` atomically (temp folder + rename)."""
    import yaml

    final = out / name
    tmp = out / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    desc = task.export(tmp)
    (tmp / "detector.yaml").write_text(yaml.safe_dump({"format": EXPORT_FORMAT, **desc, **meta}, sort_keys=False))
    old = out / f".{name}.old-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------- eval
def val_auroc(detector, items: list[Item], labels: np.ndarray, batch_size: int, rank: int, world: int) -> dict:
    """Pooled and per-generator-mean AUROC (0-100) of ``detector`` on the val items, scored across ranks."""
    import pandas as pd
    from accelerate.utils import gather_object

    from halsift.eval.detection import MetricError, auroc, auroc_by_generator

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


# ---------------------------------------------------------------------------------------------- the run
def train_detector(cfg: DetectorTrainConfig) -> dict:
    """Run (or resume) LoRA fine-tuning; returns ``{"adapter": path, "best_step", "val/auroc", ...}``."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, set_seed

    # ---- setup ---------------------------------------------------------------------------------
    cfg.validate()
    kind = cfg.resolved_kind()
    if not Path(cfg.bench).is_file():
        raise FileNotFoundError(f"bench: {cfg.bench} does not exist")
    cuda = torch.cuda.is_available()
    multi = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    handlers = [InitProcessGroupKwargs(backend="nccl" if cuda else "gloo")] if multi else []
    accelerator = Accelerator(cpu=not cuda, kwargs_handlers=handlers)
    rank, world = accelerator.process_index, accelerator.num_processes
    train_rows = bench_examples(cfg.bench, cfg.train_split)
    val_rows = bench_examples(cfg.bench, cfg.val_split) if cfg.val_split else []
    if cfg.max_val_rows:
        val_rows = val_rows[:cfg.max_val_rows]
    skipped = SkipCounter(max_examples=1000)
    train_items, y_train = readable_items(row_items(cfg.bench, [r for r, _ in train_rows]),
                                          np.array([y for _, y in train_rows], dtype=np.int64), skipped)
    val_items, y_val = readable_items(row_items(cfg.bench, [r for r, _ in val_rows]),
                                      np.array([y for _, y in val_rows], dtype=np.int64), skipped)
    if len(set(y_train.tolist())) < 2:
        raise BenchFormatError(f"bench {cfg.bench}: split {cfg.train_split!r} needs correct and incorrect rows with "
                               f"readable images, has {int(y_train.sum())} correct of {len(y_train)} usable labelled "
                               f"rows ({skipped.summary()})")
    if skipped.total:
        warnings.warn(f"bench {cfg.bench}: {skipped.summary()} rows with unreadable images left out", stacklevel=2)
    out = Path(cfg.out)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "config.json", cfg.to_dict())
        write_json_atomic(out / "run_info.json", {"world_size": world, "device": str(accelerator.device),
                                                  "distributed_type": str(accelerator.distributed_type), "kind": kind,
                                                  "train_rows": len(train_items), "val_rows": len(val_items),
                                                  "skipped": skipped.to_json()})
    set_seed(cfg.seed)
    task = build_task(cfg)
    module = task.module.to(accelerator.device)
    groups = task.param_groups(cfg)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.wd)
    scheduler = cosine_with_warmup(optimizer, cfg.warmup, cfg.steps)
    n_pos = int(y_train.sum())
    class_w = (torch.tensor([len(y_train) / (2 * (len(y_train) - n_pos)), len(y_train) / (2 * n_pos)])
               if cfg.balance == "loss" else torch.ones(2))

    start, state = 0, {"best_auroc": None, "best_step": 0, "bad_evals": 0, "stopped_early": False}
    ckpts = complete_checkpoints(out) if cfg.resume else []
    if ckpts:
        saved = load_checkpoint(ckpts[-1], TrainableView(module), optimizer, scheduler)
        start = int(saved["step"])
        state.update({k: saved[k] for k in state if k in saved})
        accelerator.print(f"resuming from {ckpts[-1]} (step {start})")
    elif cfg.resume:
        accelerator.print(f"resume: no complete checkpoint in {out / 'checkpoints'}; starting from step 0")
    model, optimizer = accelerator.prepare(module, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    sampler = StepBatches(y_train, cfg.batch_size, cfg.seed, start, cfg.steps, rank, world, cfg.balance)
    loader = torch.utils.data.DataLoader(_Examples(train_items, y_train), batch_sampler=sampler,
                                         collate_fn=task.collate, num_workers=cfg.workers)
    log = MetricsLog(out, cfg, accelerator.is_main_process, start if ckpts else None)

    def checkpoint(step: int) -> None:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            save_checkpoint(out, step, TrainableView(unwrapped), optimizer.optimizer, scheduler,
                            {"world_size": world, "batch_size": cfg.batch_size, "seed": cfg.seed, **state},
                            keep=cfg.keep_checkpoints)
        accelerator.wait_for_everyone()

    def evaluate(step: int) -> bool:
        """Val AUROC; export ``best/`` on improvement; returns True when training should stop early."""
        metrics = val_auroc(task.detector(unwrapped), val_items, y_val, cfg.eval_batch_size, rank, world) \
            if len(val_items) else {}
        auc = metrics.get("val/auroc")
        if auc is not None and (state["best_auroc"] is None or auc > state["best_auroc"]):
            state.update(best_auroc=auc, best_step=step, bad_evals=0)
            if accelerator.is_main_process:
                _export(task, out, "best", {"step": step, "val_auroc": round(auc, 4)})
        elif auc is not None:
            state["bad_evals"] += 1
        log.log(step, {**metrics, "val/best_auroc": state["best_auroc"] or float("nan")})
        return bool(cfg.patience and state["bad_evals"] >= cfg.patience)

    # ---- train ---------------------------------------------------------------------------------
    bar = progress(total=cfg.steps * cfg.batch_size * world, initial=start * cfg.batch_size * world,
                   desc=f"train detector ({kind})", unit="sent", disable=not accelerator.is_local_main_process)
    t0, step, t_last, n_last = time.perf_counter(), start, time.perf_counter(), 0
    # the loss stays on the device between log/eval/checkpoint steps: a non-finite one is recorded there and
    # checked before anything is logged, evaluated or saved
    watch = NonFiniteWatch(accelerator.device)

    def stop_if_nonfinite() -> None:
        bad = watch.seen()
        if bad:
            raise FloatingPointError(f"loss is {bad[1]} at step {bad[0]}; stopped without saving")

    model.train()
    if start == 0 and len(val_items) and not state["stopped_early"]:
        evaluate(0)  # the base detector's val AUROC: the tuned one has to beat it to replace it
    try:
        for batch in (loader if not state["stopped_early"] else []):
            labels = batch.pop("labels").to(accelerator.device)
            logits = task.forward(model, batch, accelerator.device)
            w = class_w.to(labels.device)[labels.long()]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels, weight=w)
            value = loss.detach().float()
            watch.observe(value, step + 1)
            accelerator.backward(loss)
            if cfg.grad_clip > 0:
                accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
            n_last += len(labels) * world
            bar.update(len(labels) * world)
            evals = step % cfg.eval_every == 0 or step == cfg.steps
            saves = evals or bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
            logs = step % cfg.log_every == 0 or step == cfg.steps
            if logs or saves:
                stop_if_nonfinite()
            if logs:
                now = time.perf_counter()
                value = float(value)
                log.log(step, {"train/loss": value, "train/lr": scheduler.get_last_lr()[0],
                               "train/sentences_per_s": n_last / max(now - t_last, 1e-9)})
                bar.set_postfix(loss=f"{value:.4f}")
                t_last, n_last = now, 0
            stop = False
            if evals:
                model.eval()
                stop = evaluate(step)
                model.train()
                state["stopped_early"] = stop
            if stop or saves:
                checkpoint(step)
            if stop:
                accelerator.print(f"early stop at step {step}: no better val AUROC in {cfg.patience} evaluations "
                                  f"(best {state['best_auroc']:.2f} at step {state['best_step']})")
                break
        # ---- export: the best adapter (or the last one without validation) ------------------------
        result = {"kind": kind, "last_step": step, "best_step": state["best_step"], "val/auroc": state["best_auroc"],
                  "train_seconds": time.perf_counter() - t0}
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if state["best_auroc"] is None or not (out / "best").is_dir():
                _export(task, out, "best", {"step": step, "val_auroc": None})
            final = out / "adapter"
            tmp = out / f".adapter.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(out / "best", tmp)
            if cfg.merge:
                task.load_export(tmp)  # merge the best adapter, not the last one
                task.export_merged(tmp / "merged")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            write_json_atomic(out / "result.json", {**result, "adapter": str(final.resolve())})
        accelerator.wait_for_everyone()
        result["adapter"] = str((out / "adapter").resolve())
    finally:
        # ---- cleanup -----------------------------------------------------------------------------
        bar.close()
        log.close()
        accelerator.end_training()
    return result


__all__ = ["EXPORT_FORMAT", "StepBatches", "TrainableView", "absolute_spec", "bench_examples", "row_items",
           "train_detector", "val_auroc"]
