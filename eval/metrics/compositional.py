"""Compositional hard negatives, SugarCrepe's scoring rule (``main_eval.py: text_retrieval``): a pair is right when
the image's cosine similarity to the true caption is strictly greater than to the negative caption; a category's
accuracy is the share of its pairs that are right, and ``mean`` the unweighted mean over categories (0-100)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def pair_correct(pos_score, neg_score) -> np.ndarray:
    """Per pair: True where the true caption scores strictly higher than the negative (a tie is wrong)."""
    pos, neg = np.asarray(pos_score, dtype=np.float64), np.asarray(neg_score, dtype=np.float64)
    if pos.shape != neg.shape:
        raise ValueError(f"pos_score has shape {pos.shape} but neg_score {neg.shape}")
    return pos > neg


def cosine_scores(image_emb, text_emb) -> np.ndarray:
    """Row-wise cosine similarity of paired image and text embeddings (n, d) each."""
    a, b = np.asarray(image_emb, dtype=np.float64), np.asarray(text_emb, dtype=np.float64)
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return (a * b).sum(axis=1)


def compositional_metrics(correct: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``compositional/<category>`` accuracy per category and ``compositional/mean`` over them (0-100), from the
    per-pair correctness of :func:`pair_correct`. A category without pairs is an error."""
    out = {}
    for cat, c in correct.items():
        c = np.asarray(c, dtype=bool)
        if not c.size:
            raise ValueError(f"{cat}: no pairs")
        out[f"compositional/{cat}"] = 100.0 * float(c.mean())
    if out:
        out["compositional/mean"] = float(np.mean(list(out.values())))
    return out


def sugarcrepe_result(metrics: Mapping[str, float]) -> dict[str, float]:
    """What SugarCrepe's ``main_eval.py`` writes: ``{category: accuracy}`` on its 0-1 scale."""
    return {k.split("/", 1)[1]: v / 100.0 for k, v in metrics.items()
            if k.startswith("compositional/") and k.count("/") == 1
            and k not in ("compositional/mean", "compositional/pairs")}
