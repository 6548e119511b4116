"""The finetune stage: fine-tune the base CLIP on each selection, once per seed."""

from __future__ import annotations

import dataclasses
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


def run_identity(cfg, data: Path) -> dict:
    """What a fine-tuning run is made from: its settings (those that decide what is trained), the content of the
    base weights, and the selection it trains on (its record: arguments and the digests of the scores and shards it
    was made from) or, for the whole corpus, the corpus's content."""
    from halsift.corpus.config import to_dict
    from halsift.corpus.fingerprint import path_fingerprint, spec_fingerprint
    from halsift.execution.run_folder import read_record
    from halsift.filtering.selection.guard import VOLATILE

    settings = {k: v for k, v in to_dict(cfg).items()  # not what only evaluates it or says where it runs
                if k not in ("out", "resume", "wandb_mode", "wandb_project", "wandb_run", "workers", "cache_mb", "data", "retrieval",
                             "bench", "eval_every", "eval_batch_size")}
    selection = (read_record(data / "manifest.json") or {}).get("filter")
    made_from = ({k: v for k, v in selection.items() if k not in VOLATILE} if selection is not None
                 else {"corpus": path_fingerprint(data)})
    return {"settings": settings, "base_fp": spec_fingerprint(cfg.pretrained) if cfg.pretrained else None,
            "data": made_from}


def stage_finetune(r: Recipe, p: Paths) -> dict:
    """Fine-tune the base CLIP on each selection (and the whole corpus if asked), once per seed. A finished run is
    reused while what it was made from holds (:func:`run_identity`: a selection that did not change keeps its runs);
    a run of another selection or other settings is emptied and trained again."""
    from halsift.execution.run_folder import clear_unless
    from halsift.training.clip_train import train

    todo, idents = {}, {}
    for name, runs in finetune_runs(r, p).items():
        data = [p.corpus] if name == "unfiltered" else [str(p.named("select", name))]
        for run_dir, seed in zip(runs, r.finetune.seeds):
            cfg = train_cfg(r, r.finetune, data, run_dir, p.base, seed)
            if "eval" in r.stages and not cfg.eval_every:  # the eval stage evaluates every run's final model: the
                cfg = dataclasses.replace(cfg, retrieval="", bench="")  # run's own final evaluation would repeat it
            ident = run_identity(cfg, Path(data[0]))
            if not (clear_unless(run_dir, ident) and (run_dir / "final" / "open_clip_model.safetensors").exists()):
                todo[f"{name}/seed{seed}"], idents[f"{name}/seed{seed}"] = cfg, (run_dir, ident)
    jobs = _finetune_jobs(r, len(todo))
    from halsift.execution.run_folder import made

    if jobs == 1:
        done = {}
        for k, cfg in todo.items():
            done[k] = train(cfg)
            made(*idents[k])
    else:  # independent runs: one single-threaded process per core beats one run with every thread (tiny models)
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        print(f"[halsift run] finetune: {len(todo)} runs, {jobs} at a time (one thread each)", flush=True)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {k: pool.submit(_train_single_threaded, cfg, p.run) for k, cfg in todo.items()}
            done = {}
            for k, f in futures.items():
                done[k] = f.result()
                made(*idents[k])
    return {"runs": sorted(done)}


def _finetune_jobs(r: Recipe, runs: int) -> int:
    """Fine-tuning runs at once: ``finetune.jobs`` (0: the cores) on a CPU device outside a multi-process launch,
    else 1."""
    if runs < 2 or run_device(r) != "cpu" or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return 1
    from halsift.filtering.scoring.threads import process_cores

    return max(1, min(r.finetune.jobs or process_cores(), runs))


def _train_single_threaded(cfg, run: Path) -> dict:
    """``train(cfg)`` in a worker process with one intra-op thread, so that concurrent runs share the cores; like
    the parent, it removes nothing outside the run folder."""
    import torch

    from halsift.training.clip_train import train

    torch.set_num_threads(1)
    with confined_to(run):
        return train(cfg)


STAGE = Stage("finetune", ("finetune",), stage_finetune)
