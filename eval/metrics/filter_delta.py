"""The R@k difference of two fine-tuned models and its 95% intervals, from the per-query ranks of
``eval/retrieval_ranks.npz`` (keys of :func:`halsift.eval.metrics.retrieval.ranks_key` and ``<set>/text_to_image``).

Two intervals (docs/table_f.md, "Intervals that include training noise"):

* the **query interval** (:func:`bootstrap_delta`): a paired bootstrap over the retrieval images (each replicate
  resamples a set's images with all their captions, the same draw for both models), fine-tuning seeds averaged
  inside each replicate. It covers evaluation-set sampling only.
* the **two-level interval** (:func:`delta_interval`): fine-tuning seeds and queries. The difference's variance is
  the seed level's (each model's R@k over its own seeds, ``var / n``; the models' seeds independent) plus the query
  level's (the variance of the bootstrap above), and the interval is ``delta ± t(df) * sd`` with Welch-Satterthwaite
  degrees of freedom (the query level counts as known). With 2 seeds the seed level has 1 or 2 degrees of freedom: a
  bootstrap over two seeds halves their variance and under-covers, the t quantile does not (coverage measured by
  ``benchmarks/seed_interval_coverage.py``). It errs on the wide side: a model's seed variance also holds the
  seed x query noise the query level counts.

The compare report, ``benchmarks/table_f.py`` and ``benchmarks/cascade_table.py`` all read their intervals here.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from halsift.eval.metrics.retrieval import ranks_key

Hits = tuple[np.ndarray, np.ndarray]  # (per image i2t hit, per caption t2i hit) at k


@dataclass(frozen=True)
class DeltaInterval:
    """R@k(a) - R@k(b) in points (seed means) with its 95% intervals: over the queries, and over fine-tuning seeds
    and queries (NaN where a model has one seed: its seed variance is unknown)."""

    delta: float
    query_low: float
    query_high: float
    seeds_low: float
    seeds_high: float
    df: float  # Welch-Satterthwaite degrees of freedom of the two-level interval (inf: no seed variance)

    @property
    def has_seeds(self) -> bool:
        """Whether the two-level interval exists (both models have >= 2 seeds or none)."""
        return math.isfinite(self.seeds_low) and math.isfinite(self.seeds_high)

    @property
    def bounds(self) -> tuple[float, float]:
        """The interval to read: the two-level one where it exists, else the query interval."""
        return (self.seeds_low, self.seeds_high) if self.has_seeds else (self.query_low, self.query_high)


def seed_hits(ranks: Mapping[str, np.ndarray], name: str, n_seeds: int, set_name: str, k: int = 5
              ) -> list[Hits] | None:
    """Per seed, the model's per-query hits at k (as floats); None if a seed's ranks are missing or the seeds'
    query counts differ (not one evaluation set)."""
    keys = [(ranks_key(name, i, set_name, "i2t"), ranks_key(name, i, set_name, "t2i")) for i in range(n_seeds)]
    if n_seeds < 1 or not all(key in ranks for pair in keys for key in pair):
        return None
    hits = [tuple((np.asarray(ranks[key]) < k).astype(np.float64) for key in pair) for pair in keys]
    if len({(len(h[0]), len(h[1])) for h in hits}) != 1:
        return None
    return hits


def query_hits(ranks: Mapping[str, np.ndarray], name: str, n_seeds: int, set_name: str, k: int = 5) -> Hits | None:
    """Per-query hit rate at k averaged over the model's seeds: (per image i2t, per caption t2i); None if missing."""
    hits = seed_hits(ranks, name, n_seeds, set_name, k)
    return None if hits is None else (np.mean([h[0] for h in hits], axis=0), np.mean([h[1] for h in hits], axis=0))


def bootstrap_draws(n_images: int, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """(n_boot, n_images) float counts: how often each image is drawn in each replicate (with replacement)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_images, np.full(n_images, 1.0 / n_images), size=n_boot).astype(np.float64)


def _text_to_image(ranks: Mapping[str, np.ndarray], set_name: str, hits: Sequence[Hits]) -> np.ndarray | None:
    """The set's caption -> image map, if it fits every model's hits (same images, same captions)."""
    t2i = ranks.get(f"{set_name}/text_to_image")
    if t2i is None:
        return None
    t2i, n_img = np.asarray(t2i, dtype=np.int64), len(hits[0][0])
    if any(len(h[0]) != n_img or len(h[1]) != len(t2i) for h in hits) or (t2i.size and t2i.max() >= n_img):
        return None
    return t2i


def bootstrap_delta(ranks: Mapping[str, np.ndarray], a: tuple[str, int], b: tuple[str, int], sets: Sequence[str],
                    k: int = 5, n_boot: int = 1000, seed: int = 0,
                    draws: dict[str, np.ndarray] | None = None) -> np.ndarray | None:
    """Bootstrap replicates of R@k(a) - R@k(b) (0–100 points), paired over the retrieval queries.

    ``a`` and ``b`` are ``(model, n_seeds)``. Each replicate resamples a set's images with replacement and takes
    all their captions, so i2t and t2i stay paired; both models see the same draw, and so does every call with the
    same ``seed`` (``draws`` caches it per set). Seeds are averaged inside each replicate. None where ranks are
    missing or do not fit the set. Hand-written: ``scipy.stats.bootstrap`` resamples independent observations, not
    images with all their captions, paired across two models, as one matrix product.
    """
    draws = {} if draws is None else draws
    total = np.zeros(n_boot)
    for i, s in enumerate(sets):
        ha, hb = query_hits(ranks, *a, s, k), query_hits(ranks, *b, s, k)
        t2i = _text_to_image(ranks, s, [ha, hb]) if ha is not None and hb is not None else None
        if t2i is None:
            return None
        n_img = len(ha[0])
        if s not in draws or draws[s].shape != (n_boot, n_img):
            draws[s] = bootstrap_draws(n_img, n_boot, seed + i)
        total += _set_recall(draws[s], (ha[0] - hb[0], ha[1] - hb[1]), t2i)
    return total / len(sets) if sets else None


def _set_recall(w: np.ndarray, h: Hits, t2i: np.ndarray) -> np.ndarray:
    """(i2t + t2i) / 2 R@k of per-query hits ``h`` (or of a difference of hits) per row of ``w`` (replicates x
    images: how often each image is drawn). Images without captions are left out of i2t, as in R@k."""
    n_img = w.shape[1]
    n_caps = np.bincount(t2i, minlength=n_img).astype(np.float64)
    has_cap = (n_caps > 0).astype(np.float64)
    i2t = np.where(has_cap > 0, h[0], 0.0)
    t2i_sum = np.bincount(t2i, weights=h[1], minlength=n_img)  # summed over each image's captions
    with np.errstate(invalid="ignore", divide="ignore"):
        return 50.0 * (w @ i2t / (w @ has_cap) + w @ t2i_sum / (w @ n_caps))


def seed_recalls(ranks: Mapping[str, np.ndarray], name: str, n_seeds: int, sets: Sequence[str], k: int = 5,
                 draws: Mapping[str, np.ndarray] | None = None) -> np.ndarray | None:
    """Each seed's R@k (mean over sets of the mean of i2t and t2i R@k, as ``retrieval.json``): shape (n_seeds,);
    None if missing. With ``draws`` (per set, replicates x images, as :func:`bootstrap_delta` fills them), each
    seed's R@k in each query replicate: shape (replicates, n_seeds)."""
    per_set = []
    for s in sets:
        hits = seed_hits(ranks, name, n_seeds, s, k)
        t2i = _text_to_image(ranks, s, hits) if hits is not None else None
        if t2i is None:
            return None
        w = np.ones((1, len(hits[0][0]))) if draws is None else draws[s]
        per_set.append(np.stack([_set_recall(w, h, t2i) for h in hits], axis=-1))
    if not per_set:
        return None
    out = np.mean(per_set, axis=0)
    return out[0] if draws is None else out


def delta_interval(ranks: Mapping[str, np.ndarray], a: tuple[str, int], b: tuple[str, int], sets: Sequence[str],
                   k: int = 5, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                   draws: dict[str, np.ndarray] | None = None, seedless: Collection[str] = ()
                   ) -> DeltaInterval | None:
    """R@k(a) - R@k(b) with its query interval and its two-level interval (module docstring); None where ranks are
    missing or do not fit.

    ``a`` and ``b`` are ``(model, n_seeds)``; a model in ``seedless`` (the un-tuned base model) has no fine-tuning
    seed and no seed variance. A model with one seed that is not seedless has an unknown seed variance: the
    two-level interval is NaN then. Seeds are not paired across models: seed ``s`` of two filters draws the same
    random streams, but over different selections, so its luck with one says little about the other; each model's
    seed variance counts on its own (docs/table_f.md, "Intervals that include training noise").
    """
    from scipy import stats

    reps = bootstrap_delta(ranks, a, b, sets, k, n_boot, seed, draws)
    per_seed = [seed_recalls(ranks, *m, sets, k) for m in (a, b)]
    if reps is None or not np.isfinite(reps).any() or any(r is None for r in per_seed):
        return None
    delta = float(per_seed[0].mean() - per_seed[1].mean())
    q_lo, q_hi = (float(x) for x in np.nanpercentile(reps, [50 * (1 - level), 50 * (1 + level)]))
    parts = [(0.0, math.inf) if name in seedless else
             (float(r.var(ddof=1)) / len(r), len(r) - 1.0) if len(r) >= 2 else None
             for (name, _), r in zip((a, b), per_seed)]
    if any(p is None for p in parts):
        return DeltaInterval(delta, q_lo, q_hi, math.nan, math.nan, math.nan)
    var = sum(v for v, _ in parts) + float(np.nanvar(reps, ddof=1))
    seed_term = sum(v * v / df for v, df in parts if v > 0)
    df = var * var / seed_term if seed_term > 0 else math.inf
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(var)  # df = inf: the normal quantile
    return DeltaInterval(delta, q_lo, q_hi, delta - half, delta + half, df)
