"""The finetune stage: fine-tune the base CLIP on each selection, once per seed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from halsift.corpus.safe_paths import confined_to
from halsift.launch.stages.base import Paths, Stage
from halsift.launch.stages.select import filter_names
from halsift.launch.stages.shared import run_device, train_cfg

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def finetune_runs(r: Recipe, p: Paths) -> dict[str, list[Path]]:
    """Selection (or ``unfiltered``) -> its run folders, one per ``finetune.seeds``."""
    runs = {name: [p.named("finetune", name) / f"seed{s}" for s in r.finetune.seeds] for name in filter_names(r)}
    if r.finetune.unfiltered:
        runs["unfiltered"] = [p.stage("finetune") / "unfiltered" / f"seed{s}" for s in r.finetune.seeds]
    return runs


def stage_finetune(r: Recipe, p: Paths) -> dict:
    """Fine-tune the base CLIP on each selection (and the whole corpus if asked), once per seed."""
    from halsift.training.clip_train import train

    todo = {}
    for name, runs in finetune_runs(r, p).items():
        data = [p.corpus] if name == "unfiltered" else [str(p.named("select", name))]
        for run_dir, seed in zip(runs, r.finetune.seeds):
            if not (run_dir / "final" / "open_clip_model.safetensors").exists():
                todo[f"{name}/seed{seed}"] = train_cfg(r, r.finetune, data, run_dir, p.base, seed)
    jobs = _finetune_jobs(r, len(todo))
    if jobs == 1:
        done = {k: train(cfg) for k, cfg in todo.items()}
    else:  # independent runs: one single-threaded process per core beats one run with every thread (tiny models)
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        print(f"[halsift run] finetune: {len(todo)} runs, {jobs} at a time (one thread each)", flush=True)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {k: pool.submit(_train_single_threaded, cfg, p.run) for k, cfg in todo.items()}
            done = {k: f.result() for k, f in futures.items()}
    return {"runs": sorted(done)}


def _finetune_jobs(r: Recipe, runs: int) -> int:
    """Fine-tuning runs at once: ``finetune.jobs`` (0: the cores) on a CPU device outside a multi-process launch,
    else 1."""
    if runs < 2 or run_device(r) != "cpu" or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return 1
    return max(1, min(r.finetune.jobs or os.cpu_count() or 1, runs))


def _train_single_threaded(cfg, run: Path) -> dict:
    """``train(cfg)`` in a worker process with one intra-op thread, so that concurrent runs share the cores; like
    the parent, it removes nothing outside the run folder."""
    import torch

    from halsift.training.clip_train import train

    torch.set_num_threads(1)
    with confined_to(run):
        return train(cfg)


STAGE = Stage("finetune", ("finetune",), stage_finetune)
