"""Helpers several stages use: the bench split cut, the CLIP training config, the device, the wandb log."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from halsift.corpus.safe_paths import remove_file, safe_component
from halsift.corpus.shards import write_json_atomic
from halsift.launch.stages.base import Paths, resolve_paths

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def bench_subset(bench: str, split: str, out: Path) -> str:
    """``bench`` restricted to one split (or several, comma-separated: ``train,val``), written under ``out`` with
    absolute image paths ('' if none left), and the folders they may be in (the bench's own and its
    ``image_roots.json``'s) in the subset's ``image_roots.json``.

    The cached subset records the fingerprint of the bench it was cut from (``source.json``); it is rebuilt
    whenever that bench (path or content) changed, so a new ``data.bench`` never meets the old rows."""
    from halsift.corpus.bench import image_roots, iter_bench, write_bench, write_image_roots
    from halsift.corpus.fingerprint import path_fingerprint

    if not bench or split == "none":
        return ""
    if not split:
        return bench
    folder = "+".join(s.strip() for s in split.split(","))  # train,val -> bench_train+val
    target = out / f"bench_{safe_component(folder, 'bench_split', is_key=False)}" / "bench.jsonl"
    source = target.with_name("source.json")
    ident = {"bench": str(Path(bench).resolve()), "split": split, "fingerprint": path_fingerprint(bench)}
    try:
        cached = json.loads(source.read_text()) == ident and target.exists()
    except (OSError, ValueError):
        cached = False
    if not cached:
        remove_file(source)
        remove_file(target)
        root = image_roots(bench)[0]  # normalised as the image check normalises it (symlinks kept)
        rows, wanted = [], {s.strip() for s in split.split(",")}
        for row in iter_bench(bench):
            if row.split in wanted:
                row.image = os.path.normpath(root / row.image)
                rows.append(row)
        if not rows:
            return ""
        write_bench(target, rows)
        write_json_atomic(source, ident)
    write_image_roots(target, image_roots(bench))
    return str(target)


def train_cfg(r: Recipe, t, data: list[str], out: Path, pretrained: str, seed: int):
    """The ``train clip`` config of the recipe's pretrain or finetune section ``t`` for one run into ``out``."""
    first_retrieval = next(iter(retrieval_sets(r, resolve_paths(r)).values()), "")
    bench = bench_subset(resolve_paths(r).bench, t.bench_split, Path(r.run_dir))
    return t.clip_train_config(data=data, out=str(out), model=r.model.arch, pretrained=pretrained,
                               retrieval=first_retrieval, bench=bench, eval_batch_size=r.eval.batch_size, seed=seed,
                               wandb_mode=r.wandb.mode, wandb_project=r.wandb.project,
                               wandb_run=f"{r.name}-{out.parent.name}-{out.name}", resume=True)


def retrieval_sets(r: Recipe, p: Paths) -> dict[str, str]:
    """Retrieval set name -> its ``retrieval.jsonl`` folder or file (``data.retrieval``, else the world's)."""
    return {name: path for name, path in p.retrieval.items()}


def log_stage(r: Recipe, p: Paths, stage: str, folders: dict[str, Path]) -> None:
    """The score / select stage's figures as one wandb run (``launch/run_wandb.py``) unless wandb is disabled."""
    if r.wandb.mode != "disabled" and folders:
        from halsift.launch.run_wandb import log_recipe_stage

        log_recipe_stage(stage, p.stage(stage), folders, r.wandb.mode, r.wandb.project, r.name)


def run_device(r: Recipe) -> str:
    """``device`` of the recipe, ``auto`` resolved: cuda when there is one (and ``HALSIFT_FORCE_CPU`` is unset)."""
    import torch

    if r.device != "auto":
        return r.device
    return "cuda" if torch.cuda.is_available() and not os.environ.get("HALSIFT_FORCE_CPU") else "cpu"
