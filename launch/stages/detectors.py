"""The detectors stage: train each ``detectors`` entry (LoRA detector or the world's VLM judge)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from halsift.corpus.config import ConfigError
from halsift.launch.stages.base import Paths, Stage

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def trained_spec(r: Recipe, p: Paths, name: str) -> str:
    """The ``lora:DIR`` spec the detectors stage produces for ``detectors.NAME``; with ``trust_remote_code=true``
    when the recipe's own ``detectors.NAME.base`` has it (the adapter folder's ``detector.yaml`` never grants it)."""
    out = p.named("detectors", name)
    if r.detectors[name].kind == "world_judge":
        from halsift.synth.world_judge_config import world_judge_spec

        return world_judge_spec(out, trained_configs(r, p)[name])
    return f"lora:{out / 'adapter'}" + (",trust_remote_code=true" if _base_grants_remote_code(r, p, name) else "")


def _base_grants_remote_code(r: Recipe, p: Paths, name: str) -> bool:
    from halsift.filtering.detectors.spec import parse_spec

    subs = {"run_dir": str(p.run), "base": p.base, "arch": r.model.arch}
    try:
        _, opts = parse_spec(substitute(r.detectors[name].base, f"detectors.{name}.base", subs))
    except ValueError:  # a malformed base is reported by the detectors stage's own validation
        return False
    return opts.get("trust_remote_code") is True


def substitute(spec: str, where: str, subs: dict) -> str:
    """``spec`` with its ``{placeholders}`` filled from ``subs``; an unknown or bad one is a ConfigError naming
    ``where``."""
    try:
        return spec.format(**subs)
    except KeyError as e:
        raise ConfigError(f"{where}: unknown placeholder {{{e.args[0]}}}; known: {sorted(subs)}") from None
    except (ValueError, IndexError) as e:
        raise ConfigError(f"{where}: bad placeholder in {spec!r} ({e})") from None


def trained_configs(r: Recipe, p: Paths) -> dict:
    """``detectors.NAME`` -> a validated ``DetectorTrainConfig`` (lora) or ``WorldJudgeSettings`` (world_judge)."""
    from halsift.corpus.config import from_dict
    from halsift.training.detector_config import DetectorTrainConfig
    from halsift.synth.world_judge_config import WorldJudgeSettings

    subs = {"run_dir": str(p.run), "base": p.base, "arch": r.model.arch}
    out = {}
    for name, t in r.detectors.items():
        where = f"detectors.{name}.options"
        if t.kind == "world_judge":  # string options may name {base} / {arch} (vision_from, vision_arch)
            opts = {k: substitute(v, f"{where}.{k}", subs) if isinstance(v, str) else v
                    for k, v in t.options.items()}
            out[name] = from_dict(WorldJudgeSettings, opts, prefix=where)
            continue
        if not p.bench:
            raise ConfigError(f"detectors.{name}: kind lora trains on a bench; set data.bench")
        fixed = {"base": substitute(t.base, f"detectors.{name}.base", subs), "bench": p.bench,
                 "out": str(p.named("detectors", name)), "seed": r.seed, "resume": True,
                 "wandb_mode": r.wandb.mode, "wandb_project": r.wandb.project, "wandb_run": f"{r.name}-{name}"}
        out[name] = from_dict(DetectorTrainConfig, {**fixed, **t.options}, prefix=where)
    return out


MIN_CORES_PER_JOB = 4  # a CPU training run below this many threads is slower than running the detectors in turn


def plan_jobs(detectors: int, cores: int, gpus: int, jobs: int = 0) -> int:
    """Detectors trained at once: ``jobs`` when set (>= 1), else one per GPU with two or more GPUs, one at a time
    on one GPU, and on CPU one per :data:`MIN_CORES_PER_JOB` cores (so one at a time below 8 cores)."""
    if jobs:
        return max(1, min(jobs, detectors))
    if gpus >= 2:
        return max(1, min(detectors, gpus))
    if gpus == 1:
        return 1
    return max(1, min(detectors, cores // MIN_CORES_PER_JOB))


def _cores() -> int:
    """The cores this process may use (its affinity, a SLURM allocation's included)."""
    from halsift.filtering.scoring.threads import process_cores

    return process_cores()


def trained_identity(cfg) -> dict:
    """What a LoRA detector of the recipe is made from: its training settings, and the content of its base's weights
    and of the bench it learns from (:func:`~halsift.corpus.fingerprint.spec_fingerprint`)."""
    from halsift.corpus.config import to_dict
    from halsift.corpus.fingerprint import path_fingerprint, spec_fingerprint

    settings = {k: v for k, v in to_dict(cfg).items() if k not in ("wandb_mode", "wandb_project", "wandb_run")}
    return {"settings": settings, "base_fp": spec_fingerprint(cfg.base), "bench_fp": path_fingerprint(cfg.bench)}


def _train_one(r: Recipe, p: Paths, name: str, cfg) -> str:
    """Train ``detectors.NAME`` and return its spec. A finished one is reused while what it was made from holds (the
    world judge: its own cache record; a LoRA detector: :func:`trained_identity`); one made from other settings or
    another base is trained again, the other detectors untouched."""
    from halsift.execution.run_folder import clear_unless, made

    spec = trained_spec(r, p, name)
    out = p.named("detectors", name)
    started = time.time()
    if r.detectors[name].kind == "world_judge":
        from halsift.synth.world_judge import build_world_judge

        built = build_world_judge(p.stage("world"), out, seed=r.seed, settings=cfg, show_progress=True)
        assert built == spec, (built, spec)
    elif not (clear_unless(out, ident := trained_identity(cfg)) and (out / "adapter" / "detector.yaml").exists()):
        from halsift.training.detector_train import train_detector

        train_detector(cfg)
        made(out, ident)
    print(f"[halsift run] detectors.{name}: {spec} ({time.time() - started:.1f}s)", flush=True)
    return spec


def _init_worker(gpu_ids, threads: int) -> None:
    """A spawned training process: its own GPU (``CUDA_VISIBLE_DEVICES``, claimed once per process before torch
    starts CUDA) or its share of the cores."""
    if gpu_ids is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_ids.get())
    import torch

    torch.set_num_threads(max(1, threads))


def _train_in_process(r: Recipe, p: Paths, name: str, cfg) -> str:
    """:func:`_train_one` in a spawned worker; like the parent, it removes nothing outside the run folder."""
    from halsift.corpus.safe_paths import confined_to

    with confined_to(p.run):
        return _train_one(r, p, name, cfg)


def stage_detectors(r: Recipe, p: Paths) -> dict:
    """Train each ``detectors`` entry (a finished one is reused: its adapter, or the judge's cache record), one
    after another or, where the machine allows (:func:`plan_jobs`, ``detector_jobs``), several at once, each in
    its own process; every run is seeded, so the adapters are the same either way (to floating-point rounding when
    the thread counts differ)."""
    from halsift.launch.stages.shared import run_device

    configs = trained_configs(r, p)
    gpus = 0
    if run_device(r) == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    jobs = plan_jobs(len(configs), _cores(), gpus, r.detector_jobs)
    if jobs == 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a multi-process launch trains in its ranks
        return {"trained": {name: _train_one(r, p, name, cfg) for name, cfg in configs.items()}}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, _cores() // jobs)
    ctx = multiprocessing.get_context("spawn")
    gpu_ids = None
    if gpus >= 2:
        visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
        gpu_ids = ctx.Queue()
        for i in range(jobs):  # the parent's visible GPUs, in turn
            gpu_ids.put(visible[i % len(visible)] if visible else i % gpus)
    where = "one GPU each" if gpu_ids is not None else f"{threads} thread(s) each"
    print(f"[halsift run] detectors: {len(configs)} trained {jobs} at a time ({where})", flush=True)
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(gpu_ids, threads)) as pool:
        futures = {name: pool.submit(_train_in_process, r, p, name, cfg) for name, cfg in configs.items()}
        return {"trained": {name: f.result() for name, f in futures.items()}}


STAGE = Stage("detectors", ("detectors",), stage_detectors)
