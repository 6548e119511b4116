"""The eval stage: detectors on the bench, retrieval, zero-shot classification and compositional hard negatives of
every fine-tuned model, the extra evaluations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from halsift.corpus.config import ConfigError
from halsift.corpus.shards import write_json_atomic
from halsift.launch.stages.base import Paths, Stage
from halsift.launch.stages.finetune import finetune_runs
from halsift.launch.stages.score import scored_names, scores_dir
from halsift.launch.stages.shared import bench_subset, retrieval_sets, run_device

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def stage_eval(r: Recipe, p: Paths) -> dict:
    """Detector AUROC on the bench split, retrieval, zero-shot and compositional accuracy of every model (base, each
    fine-tune), the `evals:`."""
    import torch

    from halsift.corpus.scores import read_scores_df
    from halsift.eval.runs.bench_eval import evaluate_bench
    from halsift.eval.metrics.retrieval import evaluate_retrieval, ranks_key, write_ranks
    from halsift.filtering.models.clip_models import load_open_clip
    from halsift.filtering.models.clip_tokenizer import get_tokenizer
    from halsift.launch.eval_beyond import evaluate_beyond, hits_key, load_beyond_sets, write_beyond

    out_dir = p.stage("eval")
    out_dir.mkdir(parents=True, exist_ok=True)
    bench_metrics = {}
    if p.bench and "score" in r.stages:
        scores = {name: read_scores_df(scores_dir(p, name, "bench")) for name in scored_names(r)}
        bench = bench_subset(p.bench, r.eval.bench_split, p.run)
        if not bench:
            raise ConfigError(f"eval.bench_split: no rows of split {r.eval.bench_split!r} in {p.bench}")
        cfg = r.eval.bench_config(bench=str(bench), seed=r.seed)
        bench_metrics = evaluate_bench(bench, scores, out_dir / "bench", keep=cfg.keep, seed=cfg.seed,
                                       self_pref_map=cfg.self_preference_map(), n_boot=cfg.n_boot, plots=cfg.plots)
    device = run_device(r)
    models = {"no-tune": [p.base]} if r.finetune.no_tune and p.retrieval else {}
    if "finetune" in r.stages and p.retrieval:
        for name, runs in finetune_runs(r, p).items():
            models[name] = [str(d / "final" / "open_clip_model.safetensors") for d in runs]
    retrieval: dict[str, list[dict]] = {}
    ranks = {}  # per-query ranks of every model, for the report's bootstrap CIs
    tasks, pairs = load_beyond_sets(r, p.stage("world")) if models else ({}, {})
    beyond: dict[str, list[dict]] = {}
    beyond_hits = {}
    for name, weights in models.items():
        for i, w in enumerate(weights):
            model, _, preprocess = load_open_clip(r.model.arch, pretrained=w, device=device)
            tokenizer = get_tokenizer(r.model.arch)
            model.eval()
            res = {}
            for set_name, path in retrieval_sets(r, p).items():
                with torch.no_grad():
                    m, rk = evaluate_retrieval(model, preprocess, tokenizer, path, device, r.eval.batch_size,
                                               return_ranks=True, precision=r.finetune.precision)
                res.update({f"{set_name}/{k}": v for k, v in m.items()})
                ranks.update({ranks_key(name, i, set_name, d): rk[d] for d in ("i2t", "t2i")})
                ranks[f"{set_name}/text_to_image"] = rk["text_to_image"]
            retrieval.setdefault(name, []).append(res)
            if tasks or pairs:
                m, hits = evaluate_beyond(model, preprocess, tokenizer, tasks, pairs, device, r.eval.batch_size,
                                          r.finetune.precision)
                beyond.setdefault(name, []).append(m)
                beyond_hits |= {hits_key(name, i, k): v for k, v in hits.items()}
    write_json_atomic(out_dir / "retrieval.json", retrieval)
    write_beyond(out_dir, beyond, beyond_hits)
    if ranks:
        write_ranks(out_dir / "retrieval_ranks.npz", ranks)
    extra = run_extra_evals(r, out_dir)
    return {"bench": bench_metrics, "retrieval_models": sorted(retrieval), "evals": extra}


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
