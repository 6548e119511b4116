"""Bootstrap 95% confidence intervals for the benchmark AUROCs, resampling *images* (clusters), not sentences.

The sentences of one caption (and the captions of one image) are correlated, so the resampling unit is the
image: each replicate draws the bench's images with replacement and weights every sentence by how often its
image was drawn. The same draw serves every generator in a replicate, so the CI of the mean over generators keeps
the correlation of generators that captioned the same images. AUROC with integer weights is computed for all
replicates at once from tie groups of the sorted scores (no per-replicate sklearn call).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from halsift.eval.metrics.detection import MetricError, generator_table, labelled

_MAX_CELLS = 4_000_000  # replicates x sentences held at once


def weighted_auroc_batch(pos: np.ndarray, scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUROC (0–100) for each row of ``weights`` (replicates x sentences); NaN where a class has zero weight.

    ``pos`` marks the positive (correct) sentences. Ties count one half, as in ``roc_auc_score``.
    """
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    p = pos[order].astype(np.float64)
    w = weights[:, order].astype(np.float64)
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    P = np.add.reduceat(w * p, starts, axis=1)
    N = np.add.reduceat(w * (1.0 - p), starts, axis=1)
    below = np.cumsum(N, axis=1) - N
    num = (P * (below + 0.5 * N)).sum(axis=1)
    den = P.sum(axis=1) * N.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, 100.0 * num / den, np.nan)


def bootstrap_auroc(df: pd.DataFrame, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                    unit: str = "image_id") -> dict[str, tuple[float, float]]:
    """Percentile CIs for the keys of :func:`halsift.eval.metrics.detection.auroc_by_generator`.

    ``df`` is a scored bench (``generator``, ``generator_type``, ``label``, ``score`` and the resampling
    ``unit`` column, by default ``image_id``). Returns ``{"auroc/<generator>": (lo, hi), "auroc/mean": ...,
    "auroc/i2t": ..., "auroc/t2i": ...}`` for the generators with both classes. Replicates in which a generator
    happens to lose a class are skipped for that generator. Seeded: the same data and seed give the same CIs.
    """
    if unit not in df.columns:
        raise MetricError(f"bootstrap: scored bench lacks the resampling column '{unit}'")
    if n_boot < 10:
        raise MetricError(f"bootstrap: n_boot={n_boot}, expected at least 10")
    table = generator_table(df)
    ok = table[table["auroc"].notna()]
    if ok.empty:
        raise MetricError("bootstrap: no generator has both correct and incorrect sentences")
    d = labelled(df)
    codes, uniques = pd.factorize(d[unit])
    n_units = len(uniques)
    gens = []
    for r in ok.itertuples():
        m = (d["generator"] == r.generator).to_numpy()
        gens.append((r.generator, r.generator_type, codes[m], (d.loc[m, "label"] == "correct").to_numpy(),
                     d.loc[m, "score"].to_numpy(dtype=np.float64)))
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, _MAX_CELLS // max(1, len(d))))
    values = np.empty((n_boot, len(gens)))
    done = 0
    while done < n_boot:
        b = min(chunk, n_boot - done)
        counts = rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=b)
        for j, (_, _, c, pos, s) in enumerate(gens):
            values[done:done + b, j] = weighted_auroc_batch(pos, s, counts[:, c])
        done += b
    q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)

    def ci(v: np.ndarray) -> tuple[float, float]:
        v = v[~np.isnan(v)]
        if v.size == 0:
            return (float("nan"), float("nan"))
        lo, hi = np.percentile(v, q)
        return (float(lo), float(hi))

    out = {f"auroc/{g[0]}": ci(values[:, j]) for j, g in enumerate(gens)}
    with warnings.catch_warnings():  # a replicate where every generator lost a class: nanmean of nothing
        warnings.simplefilter("ignore", RuntimeWarning)
        out["auroc/mean"] = ci(np.nanmean(values, axis=1))
        for gtype in ("i2t", "t2i"):
            cols = [j for j, g in enumerate(gens) if g[1] == gtype]
            if cols:
                out[f"auroc/{gtype}"] = ci(np.nanmean(values[:, cols], axis=1))
    return out
