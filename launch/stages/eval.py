"""The eval stage: every evaluation through the registry (:data:`halsift.eval.registry.EVALS`): the detectors on
the bench (``bench``), the per-model evaluations (retrieval, zero-shot, compositional) of every model, and the
extra evaluations of ``evals:``. What is the recipe's own here: which models, and where each per-model evaluation's
sets come from (:data:`RECIPE_SETS`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from halsift.corpus.config import ConfigError
from halsift.launch.stages.base import Paths, Stage
from halsift.launch.stages.finetune import finetune_runs
from halsift.launch.stages.score import scored_names, scores_dir
from halsift.launch.stages.shared import bench_subset, retrieval_sets, run_device

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def zeroshot_sets(r: Recipe, p: Paths) -> dict[str, str]:
    """Task name -> classification folder: ``data.zeroshot``, else the world's tasks (none when turned off)."""
    if not r.eval.zeroshot:
        return {}
    if r.data.zeroshot:
        return dict(r.data.zeroshot)
    root = p.stage("world") / "zeroshot"
    return {d.name: str(d) for d in sorted(root.iterdir()) if d.is_dir()} if r.world.enabled and root.is_dir() else {}


def compositional_sets(r: Recipe, p: Paths) -> dict[str, str]:
    """The SugarCrepe folder: ``data.compositional``, else the world's (none when there is none or it is off)."""
    if not r.eval.compositional:
        return {}
    comp = p.stage("world") / "compositional"
    folder = r.data.compositional or (str(comp) if r.world.enabled and comp.is_dir() else "")
    return {"compositional": folder} if folder else {}


# per-model evaluation of the registry -> the sets a recipe evaluates every model on ({set name: path}; none: not run)
RECIPE_SETS: dict[str, Callable[[Recipe, Paths], dict[str, str]]] = {
    "retrieval": retrieval_sets, "zeroshot": zeroshot_sets, "compositional": compositional_sets}


def recipe_models(r: Recipe, p: Paths) -> dict[str, list[str]]:
    """The models the stage evaluates, each with one weights file per fine-tuning seed: the base (``no-tune``) and
    every fine-tuned filter; none without a retrieval set."""
    models = {"no-tune": [p.base]} if r.finetune.no_tune and p.retrieval else {}
    if "finetune" in r.stages and p.retrieval:
        for name, runs in finetune_runs(r, p).items():
            models[name] = [str(d / "final" / "open_clip_model.safetensors") for d in runs]
    return models


def stage_eval(r: Recipe, p: Paths) -> dict:
    """Detector AUROC on the bench split, retrieval, zero-shot and compositional accuracy of every model (base, each
    fine-tune), the `evals:`."""
    from halsift.eval.registry import per_model_evals
    from halsift.eval.runs.per_model import evaluate_models

    out_dir = p.stage("eval")
    out_dir.mkdir(parents=True, exist_ok=True)
    bench_metrics = run_bench_eval(r, p, out_dir / "bench") if p.bench and "score" in r.stages else {}
    evals = per_model_evals()
    missing = sorted(set(evals) - set(RECIPE_SETS))
    if missing:
        raise LookupError(f"per-model evaluation(s) {missing} of the registry: no recipe sets in "
                          "launch/stages/eval.py RECIPE_SETS")
    models = recipe_models(r, p)
    evaluate_models(models, r.model.arch, evals, {name: RECIPE_SETS[name](r, p) for name in evals} if models else {},
                    out_dir, run_device(r), r.eval.batch_size, r.finetune.precision)
    extra = run_extra_evals(r, out_dir)
    return {"bench": bench_metrics, "retrieval_models": sorted(models), "evals": extra}


def run_bench_eval(r: Recipe, p: Paths, out: Path) -> dict:
    """``eval bench`` with the recipe's eval section on its bench split, given the score stage's bench scores of
    every detector and ensemble; its metrics."""
    from halsift.corpus.scores import read_scores_df
    from halsift.launch.eval_command import run_eval

    bench = bench_subset(p.bench, r.eval.bench_split, p.run)
    if not bench:
        raise ConfigError(f"eval.bench_split: no rows of split {r.eval.bench_split!r} in {p.bench}")
    folders = {name: scores_dir(p, name, "bench") for name in scored_names(r)}
    cfg = r.eval.bench_config(bench=str(bench), scores=[str(f) for f in folders.values()], out=str(out),
                              seed=r.seed, html=False)
    return run_eval("bench", cfg, {name: read_scores_df(f) for name, f in folders.items()}).metrics


def run_extra_evals(r: Recipe, out_dir: Path) -> dict:
    """I-HallA / VOPE / VIGIL: each eval's library function with its recipe section (the synthetic world wired
    in where a section says ``synthetic``), into ``<run_dir>/eval/NAME``."""
    from dataclasses import replace

    from halsift.launch.eval_command import run_eval

    done = {}
    for name, cfg in r.evals.enabled().items():
        target = out_dir / name
        if not (target / "metrics.json").exists():
            run_eval(name, replace(cfg, out=str(target)))
        done[name] = str(target)
    return done


STAGE = Stage("eval", ("eval", "evals"), stage_eval, clears=True)  # data.zeroshot / .compositional: "data" feeds pretrain
