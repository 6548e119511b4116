"""Zero-shot classification metrics, as CLIP_benchmark computes them (``clip_benchmark/metrics/
zeroshot_classification.py``, 1.6): top-1 / top-5 accuracy of the logits and mean per-class recall
(``balanced_accuracy_score`` of the arg-max), on a 0-100 scale. Top-5 is NaN below 5 classes, as there.

The classifier is CLIP_benchmark's too: per class, the mean of the L2-normalised text embeddings of its prompts,
normalised again; logits are ``100 * normalised image embedding @ classifier``.
"""

from __future__ import annotations

import numpy as np


def class_embedding(text_emb) -> np.ndarray:
    """One class's zero-shot weight from its prompts' text embeddings (n_prompts, d): mean of the normalised rows,
    normalised."""
    x = np.asarray(text_emb, dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    m = x.mean(axis=0)
    return m / max(float(np.linalg.norm(m)), 1e-12)


def zeroshot_logits(image_emb, classifier) -> np.ndarray:
    """``100 * normalised image_emb (n, d) @ classifier (d, C)``."""
    img = np.asarray(image_emb, dtype=np.float64)
    img = img / np.maximum(np.linalg.norm(img, axis=1, keepdims=True), 1e-12)
    return 100.0 * img @ np.asarray(classifier, dtype=np.float64)


def zeroshot_metrics(logits, target, n_classes: int | None = None) -> dict[str, float]:
    """``acc1``, ``acc5`` (NaN below 5 classes) and ``mean_per_class_recall`` (0-100) of ``logits`` (n, C) against
    integer labels ``target`` (n,), with sklearn's ``top_k_accuracy_score`` and ``balanced_accuracy_score``."""
    import warnings

    from sklearn.metrics import balanced_accuracy_score, top_k_accuracy_score

    logits = np.asarray(logits, dtype=np.float64)
    target = np.asarray(target, dtype=np.int64).reshape(-1)
    n_classes = logits.shape[1] if n_classes is None else n_classes
    if logits.ndim != 2 or logits.shape != (len(target), n_classes):
        raise ValueError(f"logits: expected shape ({len(target)}, {n_classes}), got {logits.shape}")
    if not len(target):
        raise ValueError("target: no samples")
    if target.min() < 0 or target.max() >= n_classes:
        raise ValueError(f"target: labels must be in [0, {n_classes}), got [{target.min()}, {target.max()}]")
    labels = np.arange(n_classes)

    def top_k(k: int) -> float:
        if n_classes == 2:  # sklearn reads a 2-class problem as binary: it wants the positive class's score
            return float(np.mean(logits.argmax(axis=1) == target)) if k == 1 else 1.0
        return float(top_k_accuracy_score(target, logits, k=k, labels=labels))

    with warnings.catch_warnings():  # a class predicted but absent from target: sklearn warns, CLIP_benchmark too
        warnings.simplefilter("ignore")
        mpcr = float(balanced_accuracy_score(target, logits.argmax(axis=1)))
    return {"acc1": 100.0 * top_k(1), "acc5": 100.0 * top_k(5) if n_classes >= 5 else float("nan"),
            "mean_per_class_recall": 100.0 * mpcr}


def clip_benchmark_result(metrics: dict, dataset: str, model: str, pretrained: str) -> dict:
    """Our zero-shot metrics as CLIP_benchmark's result JSON (``clip_benchmark eval --output``; 0-1 scale,
    ``acc5`` null where CLIP_benchmark writes NaN)."""
    out = {}
    for k in ("acc1", "acc5", "mean_per_class_recall"):
        v = metrics.get(f"zeroshot/{k}", float("nan"))
        out[k] = v / 100.0 if np.isfinite(v) else None
    return {"dataset": dataset, "model": model, "pretrained": "random-init" if pretrained in ("", "random") else pretrained,
            "task": "zeroshot_classification", "metrics": out, "language": "en"}
