"""``halsift annotate``'s sample: corpus sentences drawn for labelling, stratified by score.

The corpus's sentence scores are cut into strata at the score quantiles :data:`QUANTILES` (the bottom half, then
bands of the top half, where the thresholds that keep 5-50 % lie); each stratum gets an equal share of the ``n``
labels (so the bands near likely thresholds are sampled more densely than the bottom half), drawn uniformly without
replacement, seeded. Each drawn unit records its stratum and inclusion weight ``N_h / n_h`` (the corpus units its
label stands for), so estimates from the labels are unbiased (Horvitz-Thompson) and the guarantee
(:mod:`.guarantee`) can bound the corpus's own kept units stratum by stratum.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from halsift.filtering.detectors.base import CAPTION_INDEX

QUANTILES = (0.0, 0.5, 0.8, 0.95, 1.0)  # stratum edges as quantiles of the corpus's sentence scores


@dataclass
class Drawn:
    """The sample: per drawn unit its key, sentence index, score, stratum and weight; the strata's score edges and
    corpus counts."""

    keys: list[str]
    sentence_index: list[int]
    score: list[float]
    stratum: list[int]
    weight: list[float]
    edges: list[float]
    population: list[int]


def strata_edges(scores: np.ndarray, quantiles: tuple[float, ...] = QUANTILES) -> list[float]:
    """Increasing score edges at ``quantiles`` (ties merged); the last edge lies above every score."""
    q = np.quantile(scores, quantiles[1:-1]) if len(scores) else np.array([])
    edges = np.unique(np.concatenate([[min(0.0, float(scores.min()) if len(scores) else 0.0)], q]))
    return [float(e) for e in edges] + [float(max(100.0, scores.max() if len(scores) else 0.0)) + 1.0]


def draw(table, n: int, seed: int = 0) -> Drawn:
    """Draw ``n`` sentence units from a score table (key, sentence_index, score): equal allocation over the strata
    (a stratum smaller than its share gives the rest to the others), uniform within each."""
    t = table.filter(pc.not_equal(table["sentence_index"], CAPTION_INDEX))
    s = t["score"].to_numpy().astype(np.float64)
    if n < 1:
        raise ValueError(f"n: expected >= 1, got {n}")
    edges = strata_edges(s)
    h_of = np.clip(np.searchsorted(edges, s, side="right") - 1, 0, len(edges) - 2)
    sizes = np.bincount(h_of, minlength=len(edges) - 1)
    alloc = np.zeros_like(sizes)
    left = min(n, len(s))
    while left > 0:  # equal shares, capped at each stratum's size
        open_ = np.flatnonzero(alloc < sizes)
        share = max(1, left // len(open_))
        for h in open_:
            take = min(share, sizes[h] - alloc[h], left)
            alloc[h] += take
            left -= take
            if not left:
                break
    rng = np.random.default_rng(seed)
    keys, idx = t["key"].to_pylist(), t["sentence_index"].to_pylist()
    out = Drawn([], [], [], [], [], edges, [int(x) for x in sizes])
    for h in range(len(sizes)):
        rows = np.flatnonzero(h_of == h)
        for r in sorted(rng.choice(rows, size=int(alloc[h]), replace=False).tolist()):
            out.keys.append(keys[r])
            out.sentence_index.append(int(idx[r]))
            out.score.append(float(s[r]))
            out.stratum.append(h)
            out.weight.append(float(sizes[h] / alloc[h]))
    return out


def weighted_rate(hallucinated: np.ndarray, weight: np.ndarray) -> float:
    """The inclusion-weighted (Horvitz-Thompson ratio) hallucination rate of labelled units."""
    w = np.asarray(weight, np.float64)
    return float((w * np.asarray(hallucinated, np.float64)).sum() / w.sum())


def read_corpus_scores(scores: str | os.PathLike, detector: str | None = None):
    """The sentence scores of a corpus's score folder (checked as select checks it)."""
    from halsift.filtering.selection.select import load_scores

    table, _ = load_scores(scores, detector, captioner=False)
    return table
