"""Evaluations run on every model a recipe's eval stage loads (retrieval, zero-shot, compositional): what each
declares in the registry (:class:`PerModel`), what it gives per model (:class:`ModelScores`), and the loop that
loads each checkpoint once and runs them all on it (:func:`evaluate_models`).

Each writes ``<out>/<metrics_file>`` (``{model: [metrics per checkpoint]}``) and ``<out>/<arrays_file>`` (its
per-sample arrays, for the compare report's bootstrap CIs: ``<model>/<checkpoint index>/<key>``, and the arrays the
same for every model under their own key). Evaluations naming the same files share them: a checkpoint's metrics
are one dict, in registry order (zero-shot and compositional: ``beyond.json``, ``beyond_hits.npz``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class ModelScores:
    """One model's results of one per-model evaluation."""

    metrics: dict[str, float]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # per sample, of this model
    shared: dict[str, np.ndarray] = field(default_factory=dict)  # per sample, the same for every model


@dataclass(frozen=True)
class PerModel:
    """How an evaluation runs on every model a recipe loads (an entry of :data:`halsift.eval.registry.EVALS`)."""

    read: Callable[[Mapping[str, str]], Any]  # {set name: path} -> the sets, read and checked once, before any model
    # evaluate(model, preprocess, tokenizer, sets, device, batch_size, precision) -> ModelScores
    evaluate: Callable[..., ModelScores]
    metrics_file: str  # <out>/<metrics_file>: {model: [metrics per checkpoint]}
    arrays_file: str  # <out>/<arrays_file>: the per-sample arrays (.npz)


def checkpoint_key(model: str, index: int, key: str) -> str:
    """Name of one checkpoint's per-sample array in an ``arrays_file``: ``<model>/<index>/<key>`` (the retrieval
    ranks' :func:`halsift.eval.metrics.retrieval.ranks_key` with ``key`` = ``<set>/<i2t|t2i>``)."""
    return f"{model}/{index}/{key}"


def evaluate_models(models: Mapping[str, Sequence[str]], arch: str, evals: Mapping[str, PerModel],
                    sets: Mapping[str, Mapping[str, str]], out_dir: str | os.PathLike, device: str, batch_size: int,
                    precision: str) -> dict[str, dict[str, list[dict]]]:
    """Run every evaluation of ``evals`` on every checkpoint of ``models`` (name -> weights, one per fine-tuning
    seed; each an open_clip ``arch``, loaded once) on its ``sets`` (eval name -> {set name: path}; none: not run),
    and write each evaluation's files under ``out_dir`` (a metrics file always, an arrays file when it holds any).
    Returns the metrics by file: ``{metrics_file: {model: [metrics per checkpoint]}}``."""
    import torch

    from halsift.corpus.shards import write_json_atomic
    from halsift.eval.metrics.retrieval import write_ranks
    from halsift.eval.preprocess_memo import PreprocessMemo
    from halsift.filtering.models.clip_models import load_open_clip
    from halsift.filtering.models.clip_tokenizer import get_tokenizer

    loaded = {name: pm.read(sets.get(name, {})) for name, pm in evals.items()} if models else {}
    results: dict[str, dict[str, list[dict]]] = {pm.metrics_file: {} for pm in evals.values()}
    arrays: dict[str, dict[str, np.ndarray]] = {pm.arrays_file: {} for pm in evals.values()}
    tokenizer = get_tokenizer(arch) if models else None  # one architecture: one tokenizer for every checkpoint
    memo = None  # and one image transform: each set's images read and transformed once (PreprocessMemo)
    for model_name, weights in models.items():
        for i, w in enumerate(weights):
            model, _, transform = load_open_clip(arch, pretrained=w, device=device)
            model.eval()
            if memo is None or not memo.same_transform(transform):
                memo = PreprocessMemo(transform)
            preprocess = memo
            metrics: dict[str, dict] = {}
            for name, pm in evals.items():
                if not loaded[name]:
                    continue
                with torch.no_grad():
                    s = pm.evaluate(model, preprocess, tokenizer, loaded[name], device, batch_size, precision)
                metrics.setdefault(pm.metrics_file, {}).update(s.metrics)
                arrays[pm.arrays_file] |= {checkpoint_key(model_name, i, k): v for k, v in s.arrays.items()}
                arrays[pm.arrays_file] |= s.shared
            for file, m in metrics.items():
                results[file].setdefault(model_name, []).append(m)
    out = Path(out_dir)
    for file, by_model in results.items():
        write_json_atomic(out / file, by_model)
    for file, named in arrays.items():
        if named:
            write_ranks(out / file, named)
    return results
