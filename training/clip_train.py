"""``halsift train clip``: fine-tune an open_clip model on shards, evaluating retrieval and detection in the loop.

Reads top to bottom: setup -> train -> eval -> checkpoint -> cleanup. Runs unchanged under ``python``,
``torchrun`` and ``accelerate launch`` (accelerate's ``Accelerator`` reads rank/world size from the
environment; gloo on CPU).

Run folder (``cfg.out``)::

    config.json               resolved config
    run_info.json             world size, device, precision
    metrics.jsonl             one line per logged step ("train/loss", ...) and per evaluation ("i2t/r@5", "auroc/mean")
    clip_benchmark/step_NNNNNN.json   each in-loop retrieval eval in CLIP_benchmark's result layout
    checkpoints/step_NNNNNN/  model.safetensors, optimizer.pt, scheduler.pt, rng.pt, state.json (written last)
    final/open_clip_model.safetensors   loads with open_clip.create_model_and_transforms(arch, pretrained=PATH)

Checkpoints are written into ``checkpoints/.step_NNNNNN.tmp-PID`` and renamed; only ``step_NNNNNN`` folders with a
``state.json`` count as complete, so a run killed mid-save is never resumed from a half-written checkpoint.
Data position on resume: see :mod:`halsift.training.clip_data` (the same stream is rebuilt and the consumed
batches are skipped, exact when world size, workers and batch size are unchanged; otherwise reseeded by step).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import time
import uuid
import warnings
from pathlib import Path

import torch

from halsift.corpus.atomic import write_text_atomic
from halsift.corpus.progress import progress
from halsift.corpus.shards import ShardFormatError, expand_shards, write_json_atomic
from halsift.training.clip_config import ClipTrainConfig, check_model_name, ensure_model_configs

_CKPT_RE = re.compile(r"^step_(\d{6,})$")
FAULT_KILL_ENV = "HALSIFT_FAULT_KILL_AFTER_STEP"  # test hook: SIGKILL this process right after step N's checkpoint


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/inf; training stopped without writing a checkpoint."""


class NonFiniteWatch:
    """Records, on the device, the first step whose loss is not finite and that loss, so a training loop needs no
    host sync per step: :meth:`seen` reads it back only where the loop logs, evaluates or saves."""

    def __init__(self, device) -> None:
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.value = torch.zeros((), device=device)

    def observe(self, loss: torch.Tensor, step: int) -> None:
        """Note ``loss`` (a 0-d tensor) of 1-based ``step`` without leaving the device."""
        new = (self.step == 0) & ~torch.isfinite(loss)
        self.step = torch.where(new, step, self.step)
        self.value = torch.where(new, loss, self.value)

    def flag(self) -> torch.Tensor:
        """1.0 once a non-finite loss was observed (a device tensor, e.g. for a cross-rank reduce)."""
        return (self.step > 0).float()

    def seen(self) -> tuple[int, float] | None:
        """``(step, loss)`` of the first non-finite loss, or None (one host sync)."""
        step = int(self.step)
        return (step, float(self.value)) if step else None


# ---------------------------------------------------------------------------------------------- helpers
def build_loss(cfg: ClipTrainConfig, rank: int, world_size: int):
    """``feats -> loss`` with open_clip's ClipLoss (negatives gathered across ranks) or SigLipLoss."""
    from open_clip.loss import ClipLoss, SigLipLoss

    if cfg.loss == "siglip":
        siglip = SigLipLoss(rank=rank, world_size=world_size)
        return lambda f: siglip(f["image_features"], f["text_features"], f["logit_scale"], f["logit_bias"])
    clip = ClipLoss(local_loss=False, gather_with_grad=True, cache_labels=True, rank=rank, world_size=world_size)
    return lambda f: clip(f["image_features"], f["text_features"], f["logit_scale"])


def cosine_with_warmup(optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to the peak lr, then cosine decay to 0 at ``total`` steps."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress_ = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress_)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def param_groups(model: torch.nn.Module, wd: float) -> list[dict]:
    """Weight decay on matrices only (open_clip_train's rule: no decay on gains, biases, logit scale)."""
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        exclude = p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n or "logit_bias" in n
        (no_decay if exclude else decay).append(p)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": wd}]


def complete_checkpoints(out: str | os.PathLike) -> list[Path]:
    """``checkpoints/step_NNNNNN`` folders whose ``state.json`` exists, oldest first (temp folders ignored)."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _CKPT_RE.match(p.name)
             and (p / "state.json").is_file() and (p / "model.safetensors").is_file()]
    return sorted(found, key=lambda p: int(_CKPT_RE.match(p.name).group(1)))


def load_model(arch: str, pretrained: str | None = None, device="cpu", **kw):
    """:func:`halsift.filtering.clip_detector.load_open_clip` (SigLIP fine-tunes with a stored ``logit_bias``
    load too); a damaged safetensors file is an error naming it as ``pretrained``."""
    from safetensors import SafetensorError

    from halsift.filtering.clip_detector import load_open_clip

    try:
        return load_open_clip(arch, pretrained, device=device, **kw)
    except SafetensorError as e:
        raise SafetensorError(f"pretrained: {e}") from None


def save_state_dict_safetensors(model: torch.nn.Module, path: Path) -> None:
    """Plain open_clip state dict as safetensors (what ``open_clip.load_checkpoint`` reads)."""
    from safetensors.torch import save_file

    sd = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    save_file(sd, str(path))


def save_checkpoint(out: Path, step: int, model, optimizer, scheduler, state: dict, keep: int = 0) -> Path:
    """Write ``checkpoints/step_NNNNNN`` atomically (temp folder + rename); prune to the newest ``keep``."""
    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_state_dict_safetensors(model, tmp / "model.safetensors")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, tmp / "rng.pt")
    write_json_atomic(tmp / "state.json", {"step": step, **state})  # last: marks the folder complete
    if final.exists():  # a leftover without state.json, or a rerun of the same step
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep:
        for old in complete_checkpoints(out)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler) -> dict:
    """Restore weights (safetensors), optimizer/scheduler/RNG (torch.load weights_only) and return state.json."""
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path / "model.safetensors")))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return json.loads((path / "state.json").read_text())


class MetricsLog:
    """``metrics.jsonl`` (append, one JSON object per line) plus an optional wandb run; main process only."""

    def __init__(self, out: Path, cfg: ClipTrainConfig, enabled: bool, resume_step: int | None) -> None:
        self.path = out / "metrics.jsonl"
        self.enabled = enabled
        self.wandb = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():  # drop lines logged after the checkpoint we resume
            keep = [ln for ln in self.path.read_text().splitlines() if ln.strip()
                    and json.loads(ln).get("step", 0) <= resume_step]
            write_text_atomic(self.path, "".join(k + "\n" for k in keep))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        if cfg.wandb_mode != "disabled":
            import wandb

            id_file = out / "wandb_id.txt"
            run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
            id_file.write_text(run_id)
            self.wandb = wandb.init(project=cfg.wandb_project, name=cfg.wandb_run or out.name, id=run_id,
                                    dir=str(out), mode=cfg.wandb_mode, config=cfg.to_dict(), resume="allow")

    def log(self, step: int, values: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **values}, sort_keys=True) + "\n")
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


def detection_metrics(model, preprocess, tokenizer, bench: str, work_dir: Path) -> dict:
    """The model scored as a ``clip`` detector on the benchmark: ``auroc/<generator>``, ``auroc/mean`` ...

    Call on every process (the scoring runner splits the bench parts across ranks into ``work_dir``); the
    metrics are computed on the main process (others get ``{}``) and ``work_dir`` is removed afterwards.
    """
    from accelerate import PartialState

    from halsift.eval.bench_eval import bench_frame, join_scores
    from halsift.eval.detection import auroc_by_generator
    from halsift.filtering.clip_detector import ClipDetector
    from halsift.filtering.runner import score_bench

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
        shutil.rmtree(work_dir, ignore_errors=True)
    state.wait_for_everyone()
    return out


# ---------------------------------------------------------------------------------------------- the run
def train(cfg: ClipTrainConfig) -> dict:
    """Run (or resume) training; returns the final evaluation metrics (empty without eval sets)."""
    import open_clip
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, set_seed

    from halsift.training.clip_data import check_selection_complete, make_loader

    # ---- setup ---------------------------------------------------------------------------------
    cfg.validate()
    check_model_name(cfg.model)
    ensure_model_configs()
    cuda = torch.cuda.is_available()
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and cuda)
    multi = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1  # set by torchrun / accelerate launch / srun
    handlers = [InitProcessGroupKwargs(backend="nccl" if cuda else "gloo")] if multi else []
    accelerator = Accelerator(mixed_precision="bf16" if bf16 else "no", cpu=not cuda,
                              gradient_accumulation_steps=cfg.grad_accum, kwargs_handlers=handlers)
    rank, world = accelerator.process_index, accelerator.num_processes
    n_shards = [len(expand_shards(spec)) for spec in cfg.data]  # fail before building the model
    for spec in cfg.data:
        check_selection_complete(spec)
    if not cfg.resume and (complete_checkpoints(cfg.out) or (Path(cfg.out) / "final").exists()):
        raise FileExistsError(f"out: {cfg.out} already holds the checkpoints of a run; pass --resume to continue "
                              "it, or choose another --out")
    workers = cfg.workers  # one data spec: every (rank, worker) reader needs a shard of its own
    if len(n_shards) == 1 and n_shards[0] < world * max(1, workers):
        if n_shards[0] < world:
            raise ShardFormatError(f"data {cfg.data[0]}: {n_shards[0]} shard(s) cannot be split without "
                                   f"duplicates over {world} processes; write at least {world} shards")
        workers = n_shards[0] // world
        warnings.warn(f"data {cfg.data[0]}: {n_shards[0]} shard(s) for {world} process(es): using {workers} "
                      f"dataloader worker(s) per process instead of {cfg.workers}", stacklevel=2)
    out = Path(cfg.out)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "config.json", cfg.to_dict())
        write_json_atomic(out / "run_info.json", {"world_size": world, "device": str(accelerator.device),
                                                  "mixed_precision": accelerator.mixed_precision,
                                                  "distributed_type": str(accelerator.distributed_type)})
    set_seed(cfg.seed)
    pretrained = cfg.pretrained or None
    looks_like_path = pretrained and (os.sep in pretrained or pretrained.endswith((".safetensors", ".pt", ".bin")))
    if looks_like_path and not os.path.isfile(pretrained):
        raise FileNotFoundError(f"pretrained: {pretrained} is not a file")
    extra = {"init_logit_bias": -10.0} if cfg.loss == "siglip" else {}  # SigLIP's init (ignored if loaded)
    model, preprocess_train, preprocess_eval = load_model(cfg.model, pretrained, output_dict=True, **extra)
    tokenizer = open_clip.get_tokenizer(cfg.model)
    if cfg.lock_image:
        model.lock_image_tower(unlocked_groups=0, freeze_bn_stats=True)
    if cfg.lock_text:
        model.lock_text_tower(unlocked_layers=cfg.lock_text_unlocked, freeze_layer_norm=True)
    optimizer = torch.optim.AdamW(param_groups(model, cfg.wd), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                  eps=cfg.eps, fused=cuda)  # one kernel for all parameters on the GPU
    scheduler = cosine_with_warmup(optimizer, cfg.warmup, cfg.steps)  # stepped by hand once per optimizer step

    start_step, data_seed, skip = 0, cfg.seed, 0
    ckpts = complete_checkpoints(out) if cfg.resume else []
    if ckpts:
        state = load_checkpoint(ckpts[-1], model, optimizer, scheduler)
        start_step = int(state["step"])
        same_stream = (state.get("world_size"), state.get("workers"), state.get("batch_size"),
                       state.get("grad_accum"), state.get("seed")) == (world, workers, cfg.batch_size,
                                                                        cfg.grad_accum, cfg.seed)
        if same_stream:
            skip = start_step * cfg.grad_accum  # batches this rank consumed; workers fast-forward past them
        else:
            data_seed = cfg.seed + start_step
            warnings.warn(f"resume: world size/workers/batch size/seed changed since {ckpts[-1].name}; "
                          f"the data stream is reseeded with seed+step={data_seed} instead of replayed", stacklevel=2)
        accelerator.print(f"resuming from {ckpts[-1]} (step {start_step})")
    elif cfg.resume:
        accelerator.print(f"resume: no complete checkpoint in {out / 'checkpoints'}; starting from step 0")
    model, optimizer = accelerator.prepare(model, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    loss_fn = build_loss(cfg, rank, world)
    loader = make_loader(cfg.data, preprocess_train if cfg.augment else preprocess_eval, tokenizer,
                         cfg.batch_size, weights=cfg.data_weights or None, seed=data_seed, workers=workers,
                         shuffle_buffer=cfg.shuffle_buffer, skip_batches=skip)
    log = MetricsLog(out, cfg, accelerator.is_main_process, start_step if ckpts else None)
    global_batch = cfg.batch_size * cfg.grad_accum * world
    kill_after = int(os.environ.get(FAULT_KILL_ENV, "0") or 0)

    def checkpoint(step: int) -> None:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            save_checkpoint(out, step, unwrapped, optimizer.optimizer, scheduler,
                            {"world_size": world, "workers": workers, "batch_size": cfg.batch_size,
                             "grad_accum": cfg.grad_accum, "seed": cfg.seed, "model": cfg.model,
                             "samples_seen": step * global_batch}, keep=cfg.keep_checkpoints)
        accelerator.wait_for_everyone()

    def run_eval(step: int) -> dict:
        """Retrieval (main process) and bench detection (all processes share the scoring), logged together."""
        from halsift.eval.retrieval import evaluate_retrieval, retrieval_set_name, write_clip_benchmark

        accelerator.wait_for_everyone()
        metrics: dict = {}
        if cfg.bench:
            metrics.update(detection_metrics(unwrapped, preprocess_eval, tokenizer, cfg.bench,
                                             out / "eval_tmp" / f"bench_step_{step:06d}"))
        if cfg.retrieval and accelerator.is_main_process:
            with accelerator.autocast():
                rm = evaluate_retrieval(unwrapped, preprocess_eval, tokenizer, cfg.retrieval, accelerator.device,
                                        cfg.eval_batch_size)
            metrics.update(rm)
            write_clip_benchmark(out / "clip_benchmark" / f"step_{step:06d}.json", rm,
                                 retrieval_set_name(cfg.retrieval), cfg.model, f"{out.name}@step{step}")
        if metrics:
            log.log(step, metrics)
        accelerator.wait_for_everyone()
        return metrics

    # ---- train ---------------------------------------------------------------------------------
    bar = progress(total=cfg.steps * global_batch, initial=start_step * global_batch, desc="train clip",
                   unit="sample", disable=not accelerator.is_local_main_process)
    data = iter(loader)
    model.train()
    step, skipped, final_metrics = start_step, 0, {}
    t_last, n_last = time.perf_counter(), 0
    # The loss stays on the device between log steps (no host sync per micro-batch): a non-finite loss is
    # recorded there and checked before anything is logged, evaluated or saved.
    watch = NonFiniteWatch(accelerator.device)

    def stop_if_nonfinite() -> None:
        flag = watch.flag()
        if world > 1:  # every rank must stop together, or the others hang in the next collective
            flag = accelerator.reduce(flag, reduction="sum")
        if float(flag) > 0:
            at, value = watch.seen() or (step, float("nan"))  # another rank's loss went bad
            last = complete_checkpoints(out)
            log.log(at, {"event": "nonfinite_loss", "train/loss": value})
            raise NonFiniteLossError(f"loss is {value} at step {at}; stopped without saving. "
                                     f"Last good checkpoint: {last[-1] if last else 'none'}")

    try:
        while step < cfg.steps:
            loss_sum = torch.zeros((), device=accelerator.device)
            for _ in range(cfg.grad_accum):
                batch = next(data)
                skipped += int(batch["skipped"])
                images = batch["image"].to(accelerator.device, non_blocking=True)
                texts = batch["text"].to(accelerator.device, non_blocking=True)
                with accelerator.accumulate(model):
                    with accelerator.autocast():
                        feats = model(images, texts)
                        loss = loss_fn(feats)
                    value = loss.detach().float()
                    watch.observe(value, step + 1)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and cfg.grad_clip > 0:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                loss_sum += value / cfg.grad_accum
            scheduler.step()
            with torch.no_grad():  # open_clip_train clamps the temperature to 100
                unwrapped.logit_scale.clamp_(0, math.log(100))
            step += 1
            n_last += global_batch
            bar.update(global_batch)
            logs = step % cfg.log_every == 0 or step == cfg.steps
            evals = bool(cfg.eval_every) and step % cfg.eval_every == 0 and step < cfg.steps
            saves = bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0 and step < cfg.steps
            if logs or evals or saves or step == kill_after:
                stop_if_nonfinite()
            if logs:
                now = time.perf_counter()
                loss_sum = float(loss_sum)
                log.log(step, {"train/loss": loss_sum, "train/lr": scheduler.get_last_lr()[-1],
                               "train/logit_scale": float(unwrapped.logit_scale.detach().exp()),
                               "train/samples_per_s": n_last / max(now - t_last, 1e-9),
                               "train/skipped_samples": skipped})
                bar.set_postfix(loss=f"{loss_sum:.4f}")
                t_last, n_last = now, 0
            # ---- eval / checkpoint ---------------------------------------------------------------
            if evals:
                run_eval(step)
            if saves:
                checkpoint(step)
            if kill_after and step == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
        # ---- the end: final eval, last checkpoint, open_clip-loadable weights -----------------------
        stop_if_nonfinite()
        final_metrics = run_eval(step)
        checkpoint(step)
        if accelerator.is_main_process:
            final_dir = out / "final"
            tmp = out / f".final.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            save_state_dict_safetensors(unwrapped, tmp / "open_clip_model.safetensors")
            write_json_atomic(tmp / "config.json", {"model": cfg.model, "step": step, "metrics": final_metrics})
            shutil.rmtree(final_dir, ignore_errors=True)
            os.replace(tmp, final_dir)
    finally:
        # ---- cleanup -----------------------------------------------------------------------------
        bar.close()
        log.close()
        del data
        accelerator.end_training()
    return final_metrics
