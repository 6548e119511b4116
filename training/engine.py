"""One training loop for every halsift training task: CLIP contrastive (:mod:`~halsift.training.clip_train`), LoRA
detector (:mod:`~halsift.training.detector_train`) and VLM caption pre-training
(:mod:`~halsift.training.caption_pretrain`).

:func:`run` owns what every task shares: accelerate (device, DDP, mixed precision, gradient accumulation, gradient
clipping), seeding, resumable checkpoints (``Accelerator.save_state`` / ``load_state``), the non-finite-loss watch,
``metrics.jsonl`` and wandb, the progress bar. A task (:class:`Task`) says what is trained: its model, optimizer and
scheduler, its micro-batches, the loss of one micro-batch, when and how it evaluates, and what it leaves at the end.

Run folder (``cfg.out``)::

    config.json, run_info.json   the task's resolved config; world size, device, precision (+ the task's fields)
    metrics.jsonl                one JSON line per log step ("train/loss", "train/lr", ...) and per evaluation
    checkpoints/step_NNNNNN/     model.safetensors (the task's weights: the full model or only the trainable
                                 ones), optimizer.bin, scheduler.bin, random_states_<rank>.pkl (accelerate's
                                 save_state; read back with torch.load(weights_only=True)), state.json (written last:
                                 the step, the task's fields and the settings that decide what is trained, so that
                                 ``--resume`` can check them without config.json)

Checkpoints are written into ``checkpoints/.step_NNNNNN.tmp`` and renamed; only ``step_NNNNNN`` folders with a
``state.json`` count as complete, so a run killed mid-save never resumes from a half-written checkpoint. The loss
stays on the device between log steps (no host sync per micro-batch); a non-finite loss is recorded there and checked
(across ranks) before anything is logged, evaluated or saved.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from halsift.corpus.atomic import write_text_atomic
from halsift.corpus.errors import InputError
from halsift.corpus.progress import progress
from halsift.corpus.shards import write_json_atomic
from halsift.corpus.safe_paths import remove_tree, replace_path
from halsift.corpus.weights import WeightsFormatError, require_safetensors

_CKPT_RE = re.compile(r"^step_(\d{6,})$")
FAULT_KILL_ENV = "HALSIFT_FAULT_KILL_AFTER_STEP"  # test hook: SIGKILL this process right after step N's checkpoint
WEIGHTS = "model.safetensors"


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN/inf; training stopped without writing a checkpoint."""


class RunConfig(Protocol):
    """The settings :func:`run` reads from a task's config (every training config has them)."""

    out: str
    steps: int
    seed: int
    resume: bool
    log_every: int
    keep_checkpoints: int
    grad_clip: float
    # optional: checkpoint_every (Task.due's default), batch_size (progress and rate), wandb_mode (default
    # disabled), wandb_project, wandb_run

    def to_dict(self) -> dict: ...


class Task:
    """What one kind of training run trains; :func:`run` calls the methods in the order they are listed.

    Subclasses set ``cfg`` and override :meth:`build`, :meth:`batches` and :meth:`loss`; the rest has defaults.
    """

    cfg: RunConfig
    desc = "train"  # progress bar label
    unit = "sample"  # progress bar unit
    rate_key = "train/samples_per_s"
    lr_group = 0  # the param group whose lr is logged as train/lr
    show_progress = True
    stopped = False  # True once the task stopped early (the loop is skipped on resume)

    def accelerator_kwargs(self) -> dict:
        """Extra ``Accelerator`` arguments (``mixed_precision``, ``gradient_accumulation_steps``)."""
        return {}

    def setup(self, accelerator) -> dict:
        """Checks and data that need the world size, before seeding; returns extra ``run_info.json`` fields."""
        return {}

    def build(self, accelerator) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        """The model, its optimizer and an lr scheduler (stepped once per optimizer step), after seeding."""
        raise NotImplementedError

    def resume(self, state: dict) -> None:
        """Take back the task's part of a checkpoint's ``state.json`` (before :meth:`batches`)."""

    def batches(self, start: int) -> Iterator:
        """The micro-batches of steps ``start..steps-1``, ``grad_accum`` per step (after ``prepare``)."""
        raise NotImplementedError

    def begin(self, model, start: int) -> bool:
        """Called once before the first step (model in train mode); True: evaluate at step 0 first."""
        return False

    def loss(self, model, batch) -> torch.Tensor:
        """The 0-d loss of one micro-batch (under ``accelerator.autocast()``)."""
        raise NotImplementedError

    def after_step(self, model) -> None:
        """After each optimizer and scheduler step (e.g. clamp a temperature)."""

    def log_values(self, model) -> dict:
        """Extra values of a log line besides train/loss, train/lr and the rate (host syncs allowed here)."""
        return {}

    def due(self, step: int) -> tuple[bool, bool]:
        """``(evaluate, checkpoint)`` after 1-based ``step`` (default: checkpoint every ``cfg.checkpoint_every``
        steps and at the end; never evaluate)."""
        every = getattr(self.cfg, "checkpoint_every", 0)
        return False, bool(every and step % every == 0) or step == self.cfg.steps

    def evaluate(self, model, step: int) -> tuple[dict, bool]:
        """Metrics to log at ``step`` (all processes call it) and whether to stop early."""
        return {}, False

    def state(self, step: int) -> dict:
        """The task's fields of ``state.json`` at ``step``."""
        return {}

    def weights(self, model) -> dict[str, torch.Tensor]:
        """What a checkpoint's ``model.safetensors`` holds (default: the whole state dict)."""
        return model.state_dict()

    def load_weights(self, model, state: dict[str, torch.Tensor]) -> None:
        model.load_state_dict(state)

    def finish(self, model, step: int) -> dict:
        """Write the final artefacts (all processes call it); returns the run's result."""
        return {}


# ---------------------------------------------------------------------------------------------- checkpoints
def complete_checkpoints(out: str | os.PathLike) -> list[Path]:
    """``checkpoints/step_NNNNNN`` folders whose ``state.json`` exists, oldest first (temp folders ignored)."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _CKPT_RE.match(p.name)
             and (p / "state.json").is_file() and (p / WEIGHTS).is_file()]
    return sorted(found, key=lambda p: int(_CKPT_RE.match(p.name).group(1)))


def cpu_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached contiguous CPU copies (safetensors refuses shared or strided storage)."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def save_state_dict_safetensors(model: torch.nn.Module, path: Path) -> None:
    """Plain state dict as safetensors (for an open_clip model: what ``open_clip.load_checkpoint`` reads)."""
    from safetensors.torch import save_file

    save_file(cpu_state_dict(model.state_dict()), str(path))


def cosine_with_warmup(optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to the peak lr, then cosine decay to 0 at ``total`` steps."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress_ = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress_)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def use_task_weights(accelerator, task: Task) -> None:
    """Make ``save_state``/``load_state`` write and read the model as ``task.weights`` (unwrapped names, so a
    checkpoint resumes under another world size; only trainable weights where the task says so)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    def save_hook(models, weights, output_dir) -> None:
        weights[:] = [cpu_state_dict(task.weights(accelerator.unwrap_model(m))) if accelerator.is_main_process
                      else {} for m in models]

    def load_hook(models, input_dir) -> None:
        path = require_safetensors(Path(input_dir) / WEIGHTS, "checkpoint")  # a pickle: refused, not unpickled
        try:
            state = load_file(str(path))
        except SafetensorError as e:
            raise WeightsFormatError(f"checkpoint: {path} is not a valid safetensors file ({e})") from None
        for m in models:
            task.load_weights(accelerator.unwrap_model(m), state)
        models.clear()  # loaded here: accelerate's own model loading is skipped

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


def save_checkpoint(accelerator, out: Path, step: int, state: dict, keep: int = 0) -> Path:
    """``checkpoints/step_NNNNNN`` via ``accelerator.save_state`` into a temp folder, ``state.json`` last, then
    renamed; prunes to the newest ``keep``. Every process calls it (each saves its RNG state)."""
    root = out / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".{final.name}.tmp"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        remove_tree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json_atomic(tmp / "state.json", {"step": step, **state})  # last: marks the folder complete
        if final.exists():  # a leftover without state.json, or a rerun of the same step
            remove_tree(final)
        replace_path(tmp, final)
        if keep:
            for old in complete_checkpoints(out)[:-keep]:
                remove_tree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: Path) -> dict:
    """Restore model, optimizer, scheduler and RNG states of a checkpoint; returns its ``state.json``."""
    if not (path / "optimizer.bin").is_file():
        raise FileNotFoundError(f"checkpoint {path}: no optimizer.bin (a checkpoint written before halsift's training "
                                "engine, with optimizer.pt, cannot be resumed); start the run in a new --out")
    try:
        accelerator.load_state(str(path))  # optimizer, scheduler, RNG states: torch.load(weights_only=True)
    except (pickle.UnpicklingError, EOFError, RuntimeError) as e:  # a damaged or foreign file; not an unpickled one
        if isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        reason = ("a file is damaged or holds objects other than tensors and plain values: refused, not unpickled"
                  if isinstance(e, pickle.UnpicklingError) else
                  f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}")
        raise WeightsFormatError(f"checkpoint {path}: cannot be loaded ({reason}); remove this folder to resume "
                                 "from the one before it, or start the run in a new --out") from None
    return json.loads((path / "state.json").read_text())


# ---------------------------------------------------------------------------------------------- logging
class MetricsLog:
    """``metrics.jsonl`` (append, one JSON object per line) plus an optional wandb run; main process only."""

    def __init__(self, out: Path, cfg: RunConfig, enabled: bool, resume_step: int | None) -> None:
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
        if getattr(cfg, "wandb_mode", "disabled") != "disabled":
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


# ---------------------------------------------------------------------------------------------- the run
def make_accelerator(**kw):
    """An ``Accelerator`` on the GPU when there is one (gloo on CPU for a multi-process launch)."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    cuda = torch.cuda.is_available()
    multi = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1  # set by torchrun / accelerate launch / srun
    handlers = [InitProcessGroupKwargs(backend="nccl" if cuda else "gloo")] if multi else []
    # the scheduler is prepared only so save_state/load_state carry it; the loop steps it once per optimizer step
    return Accelerator(cpu=not cuda, kwargs_handlers=handlers, step_scheduler_with_optimizer=False, **kw)


# what a resumed run may change: how long it trains and how it runs, logs and checkpoints (a changed batch size, world
# size or seed reseeds the data stream, Task.resume); any other setting decides what is trained
RESUME_MAY_CHANGE = frozenset({"out", "resume", "steps", "log_every", "eval_every", "checkpoint_every",
                               "keep_checkpoints", "workers", "batch_size", "grad_accum", "seed", "device",
                               "mixed_precision", "precision", "wandb", "wandb_mode", "wandb_project", "wandb_run",
                               "no_progress"})


class ResumeMismatch(InputError):
    """``--resume`` into a folder whose run trained something else (one line naming the setting)."""


def check_resume(out: Path, cfg: RunConfig) -> None:
    """A resumed run continues the run its folder's ``config.json`` and its newest checkpoint's ``state.json``
    record (:mod:`halsift.execution.run_folder`'s rule: a setting absent from an older record compares equal only to
    its default): a setting that decides what is trained (model, data, loss, optimizer ...) is refused in one line,
    and so are checkpoints that neither record ties to their settings, and ``--steps`` below the newest
    checkpoint's step."""
    import dataclasses

    from halsift.corpus.config import field_default
    from halsift.execution.run_folder import read_record, refusal, settings_diff

    hint = "give it the recorded value, or drop --resume and choose another --out"
    newest = complete_checkpoints(out)[-1]
    saved = read_record(newest / "state.json", ResumeMismatch, "--resume: ", hint) or {}
    records = [r for r in (read_record(out / "config.json", ResumeMismatch, "--resume: ", hint),
                           saved.get("settings")) if isinstance(r, dict)]
    if not records:  # nothing ties the checkpoints to the settings that made them: a resume could mix two runs
        raise ResumeMismatch(f"--resume: {out} holds checkpoints (newest {newest.name}) but no record of the "
                             f"settings that made them (no config.json, and {newest.name}/state.json records none); "
                             "restore config.json, or drop --resume and choose another --out")
    step = int(saved.get("step", 0))
    if step > cfg.steps:
        raise ResumeMismatch(f"--resume: {newest} is at step {step}, past --steps {cfg.steps}: a resumed run cannot "
                             f"train fewer steps than it has; give --steps {step} or more (or drop --resume and "
                             "choose another --out)")
    new = resume_settings(cfg)
    fields = dataclasses.fields(cfg) if dataclasses.is_dataclass(cfg) else ()
    defaults = {f.name: field_default(f) for f in fields  # a field without a default compares equal to nothing
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    defaults = json.loads(json.dumps(defaults, default=str))  # as config.json holds them (lists, not tuples)
    for old in records:  # config.json, then the checkpoint's own record
        key = settings_diff(old, new, defaults)
        if key is not None:
            raise ResumeMismatch("--resume: " + refusal(out, f"settings.{key}", {"settings": old},
                                                        {"settings": new}, "a training run", defaults, hint))


def resume_settings(cfg: RunConfig) -> dict:
    """The settings of ``cfg`` that decide what is trained (all but :data:`RESUME_MAY_CHANGE`), as JSON holds them:
    what every checkpoint's ``state.json`` records (``settings``) and ``--resume`` compares, so that checkpoints
    stay tied to their run without ``config.json``."""
    return json.loads(json.dumps({k: v for k, v in cfg.to_dict().items() if k not in RESUME_MAY_CHANGE},
                                 default=str))


def run(task: Task) -> dict:
    """Run (or, with ``cfg.resume``, continue) ``task``; returns ``task.finish``'s result."""
    from accelerate.utils import set_seed

    cfg = task.cfg
    accelerator = make_accelerator(**task.accelerator_kwargs())
    out = Path(cfg.out)
    extra = task.setup(accelerator)
    if cfg.resume and complete_checkpoints(out):
        check_resume(out, cfg)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "config.json", cfg.to_dict())
        write_json_atomic(out / "run_info.json", {
            "world_size": accelerator.num_processes, "device": str(accelerator.device),
            "mixed_precision": accelerator.mixed_precision,
            "distributed_type": str(accelerator.distributed_type), **extra})
    set_seed(cfg.seed)
    model, optimizer, scheduler = task.build(accelerator)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    use_task_weights(accelerator, task)
    start, ckpts = 0, complete_checkpoints(out) if cfg.resume else []
    if ckpts:
        saved = load_checkpoint(accelerator, ckpts[-1])
        start = int(saved["step"])
        task.resume(saved)
        accelerator.print(f"resuming from {ckpts[-1]} (step {start})" if start < cfg.steps else
                          f"resume: {ckpts[-1]} is at step {start} = --steps: nothing left to train; the run ends "
                          "from it")
    elif cfg.resume:
        accelerator.print(f"resume: no complete checkpoint in {out / 'checkpoints'}; starting from step 0")
    loop = _Loop(task, accelerator, model, optimizer, scheduler, start,
                 MetricsLog(out, cfg, accelerator.is_main_process, start if ckpts else None))
    try:
        return loop.train()
    finally:
        loop.close()
        accelerator.end_training()


class _Loop:
    """The step loop of :func:`run` and what it does between steps (log, evaluate, checkpoint)."""

    def __init__(self, task: Task, accelerator, model, optimizer, scheduler, start: int, log: MetricsLog) -> None:
        self.task, self.cfg, self.acc = task, task.cfg, accelerator
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.step, self.log, self.out = start, log, Path(task.cfg.out)
        self.accum = accelerator.gradient_accumulation_steps
        self.global_batch = getattr(task.cfg, "batch_size", 1) * self.accum * accelerator.num_processes
        self.watch = NonFiniteWatch(accelerator.device)
        self.data = task.batches(start)
        self.bar = progress(total=self.cfg.steps * self.global_batch, initial=start * self.global_batch,
                            desc=task.desc, unit=task.unit,
                            disable=not (accelerator.is_local_main_process and task.show_progress))

    def train(self) -> dict:
        cfg, task = self.cfg, self.task
        kill_after = int(os.environ.get(FAULT_KILL_ENV, "0") or 0)
        t_last, n_last = time.perf_counter(), 0
        self.model.train()
        if task.begin(self.model, self.step):
            self.evaluate(0)
        while self.step < cfg.steps and not task.stopped:
            loss = self.train_step()
            n_last += self.global_batch
            self.bar.update(self.global_batch)
            logs = self.step % cfg.log_every == 0 or self.step == cfg.steps
            evals, saves = task.due(self.step)
            if logs or evals or saves or self.step == kill_after:
                self.stop_if_nonfinite()
            if logs:
                now = time.perf_counter()
                self.log_step(float(loss), n_last / max(now - t_last, 1e-9))
                t_last, n_last = now, 0
            stop = self.evaluate(self.step) if evals else False
            if saves or stop:
                self.checkpoint()
            if kill_after and self.step == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            if stop:
                break
        self.stop_if_nonfinite()
        return task.finish(self.acc.unwrap_model(self.model), self.step)

    def train_step(self) -> torch.Tensor:
        """``grad_accum`` micro-batches, one optimizer and scheduler step; the mean loss stays on the device."""
        acc, model = self.acc, self.model
        loss_sum = torch.zeros((), device=acc.device)
        for _ in range(self.accum):
            batch = next(self.data)
            with acc.accumulate(model):
                with acc.autocast():
                    loss = self.task.loss(model, batch)
                value = loss.detach().float()
                self.watch.observe(value, self.step + 1)
                acc.backward(loss)
                if acc.sync_gradients and self.cfg.grad_clip > 0:
                    acc.clip_grad_norm_(model.parameters(), self.cfg.grad_clip)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            loss_sum += value / self.accum
        self.scheduler.step()
        self.task.after_step(acc.unwrap_model(model))
        self.step += 1
        return loss_sum

    def log_step(self, loss: float, rate: float) -> None:
        self.log.log(self.step, {"train/loss": loss, "train/lr": self.scheduler.get_last_lr()[self.task.lr_group],
                                 self.task.rate_key: rate, **self.task.log_values(self.acc.unwrap_model(self.model))})
        self.bar.set_postfix(loss=f"{loss:.4f}")

    def evaluate(self, step: int) -> bool:
        metrics, stop = self.task.evaluate(self.model, step)
        if metrics:
            self.log.log(step, metrics)
        return stop

    def checkpoint(self) -> None:
        state = {**self.task.state(self.step), "settings": resume_settings(self.cfg)}  # ties it to its settings
        save_checkpoint(self.acc, self.out, self.step, state, keep=self.cfg.keep_checkpoints)

    def stop_if_nonfinite(self) -> None:
        """Raise :class:`NonFiniteLossError` on every rank once any rank saw a non-finite loss."""
        flag = self.watch.flag()
        if self.acc.num_processes > 1:  # every rank must stop together, or the others hang in the next collective
            flag = self.acc.reduce(flag, reduction="sum")
        if float(flag) > 0:
            at, value = self.watch.seen() or (self.step, float("nan"))  # another rank's loss went bad
            last = complete_checkpoints(self.out)
            self.log.log(at, {"event": "nonfinite_loss", "train/loss": value})
            raise NonFiniteLossError(f"loss is {value} at step {at}; stopped without saving. "
                                     f"Last good checkpoint: {last[-1] if last else 'none'}")

    def close(self) -> None:
        self.bar.close()
        self.log.close()
        self.data = None  # ends dataloader workers


__all__ = ["FAULT_KILL_ENV", "MetricsLog", "NonFiniteLossError", "NonFiniteWatch", "RunConfig", "Task",
           "complete_checkpoints", "cosine_with_warmup", "cpu_state_dict", "load_checkpoint", "make_accelerator",
           "resume_settings", "run", "save_checkpoint", "save_state_dict_safetensors"]
