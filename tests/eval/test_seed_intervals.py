"""The interval of a difference of two fine-tuned filters over fine-tuning seeds and retrieval queries
(eval/metrics/filter_delta.py): what it adds to the query bootstrap, and its coverage on a known world
(synth/retrieval_noise.py) where two filters truly differ by 0 and by 2 R@5 points, with a negative control: the
query-only interval under-covers when seed noise is present."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from halsift.eval.metrics.filter_delta import bootstrap_delta, delta_interval, seed_recalls
from halsift.eval.metrics.retrieval import ranks_key
from halsift.synth.retrieval_noise import SET, NoiseWorld, simulate

# seed noise as measured on the quickstart's world (docs/table_f.md, "Seed spread"): one filter's R@5 moves by 0.9
# points (std) between fine-tuning seeds; the judge's on world 21 moved by 2.1 (21.95 / 19.83: std 1.5)
TYPICAL = replace(NoiseWorld(), seed_sd=0.5)  # between-seed std of R@5 ~0.9 (0.8 of it seed x query noise)
LARGE = replace(NoiseWorld(), seed_sd=1.3)  # ~1.5
EXPERIMENTS = 200  # per truth


def coverage(world: NoiseWorld, seeds: int, rng_seed: int) -> dict:
    """Over EXPERIMENTS experiments per truth (0 and 2 points): how often each interval covers the truth, and the
    world's realised between-seed std of one filter's R@5 (root mean square over experiments)."""
    world, rng, draws = replace(world, seeds=seeds), np.random.default_rng(rng_seed), {}
    hits, var = {(t, kind): 0 for t in (0.0, 2.0) for kind in ("seeds", "queries")}, []
    for truth in (0.0, 2.0):
        for _ in range(EXPERIMENTS):
            ranks = simulate(world, {"judge": truth, "random": 0.0}, rng)
            iv = delta_interval(ranks, ("judge", seeds), ("random", seeds), [SET], n_boot=400, draws=draws)
            hits[truth, "seeds"] += iv.seeds_low <= truth <= iv.seeds_high
            hits[truth, "queries"] += iv.query_low <= truth <= iv.query_high
            var.append(seed_recalls(ranks, "random", seeds, [SET]).var(ddof=1))
    return {key: n / EXPERIMENTS for key, n in hits.items()} | {"seed_sd": math.sqrt(np.mean(var))}


@pytest.mark.parametrize("world, seeds, spread", [(TYPICAL, 2, (0.75, 1.05)), (LARGE, 2, (1.35, 1.8)),
                                                  (LARGE, 4, (1.35, 1.8))], ids=["typical-2", "large-2", "large-4"])
def test_two_level_interval_covers_the_truth_where_the_query_interval_does_not(world, seeds, spread):
    cov = coverage(world, seeds, rng_seed=seeds)
    assert spread[0] < cov["seed_sd"] < spread[1]  # the world's seed noise is the size it says
    for truth in (0.0, 2.0):
        assert cov[truth, "seeds"] >= 0.90, (truth, cov)  # nominal 95%
    if world is LARGE:  # negative control: the interval over the queries alone leaves the seeds out (~80-85%)
        assert (cov[0.0, "queries"] + cov[2.0, "queries"]) / 2 < 0.90, cov


def two_models(seed_hits_a: list[float], seed_hits_b: list[float], n_img: int = 200, caps: int = 2) -> dict:
    """Ranks of models ``a`` and ``b`` whose seed ``i`` hits (i2t and t2i) the first ``rate * n`` queries."""
    ranks = {f"{SET}/text_to_image": np.repeat(np.arange(n_img), caps)}
    for name, rates in (("a", seed_hits_a), ("b", seed_hits_b)):
        for i, rate in enumerate(rates):
            for d, n in (("i2t", n_img), ("t2i", n_img * caps)):
                ranks[ranks_key(name, i, SET, d)] = np.where(np.arange(n) < rate * n, 0, 9)
    return ranks


def test_the_seed_level_is_each_models_own_seed_variance():
    ranks = two_models([0.30, 0.36, 0.33], [0.20, 0.22])
    iv = delta_interval(ranks, ("a", 3), ("b", 2), [SET], n_boot=500)
    va, vb = np.var([30.0, 36.0, 33.0], ddof=1) / 3, np.var([20.0, 22.0], ddof=1) / 2
    q = bootstrap_delta(ranks, ("a", 3), ("b", 2), [SET], n_boot=500)
    var = va + vb + q.var(ddof=1)
    df = var ** 2 / (va ** 2 / 2 + vb ** 2 / 1)
    half = stats.t.ppf(0.975, df) * math.sqrt(var)
    assert iv.delta == pytest.approx(33.0 - 21.0)
    assert (iv.seeds_low, iv.seeds_high, iv.df) == pytest.approx((12.0 - half, 12.0 + half, df))
    assert (iv.query_low, iv.query_high) == pytest.approx(tuple(np.percentile(q, [2.5, 97.5])))
    assert iv.has_seeds and iv.bounds == (iv.seeds_low, iv.seeds_high)


def test_no_seed_variance_leaves_the_query_level_with_a_normal_quantile():
    ranks = two_models([0.30, 0.30], [0.20, 0.20])  # every seed alike: no seed variance, infinite df
    iv = delta_interval(ranks, ("a", 2), ("b", 2), [SET], n_boot=500)
    q = bootstrap_delta(ranks, ("a", 2), ("b", 2), [SET], n_boot=500)
    assert iv.df == math.inf
    assert iv.seeds_high - iv.delta == pytest.approx(stats.norm.ppf(0.975) * q.std(ddof=1))


def test_one_seed_has_no_seed_level_unless_the_model_has_no_seeds():
    ranks = two_models([0.30, 0.36], [0.20])
    alone = delta_interval(ranks, ("a", 2), ("b", 1), [SET], n_boot=200)
    assert not alone.has_seeds and alone.bounds == (alone.query_low, alone.query_high)
    untuned = delta_interval(ranks, ("a", 2), ("b", 1), [SET], n_boot=200, seedless=("b",))
    va = np.var([30.0, 36.0], ddof=1) / 2
    assert untuned.has_seeds and untuned.df == pytest.approx((va + np.var(
        bootstrap_delta(ranks, ("a", 2), ("b", 1), [SET], n_boot=200), ddof=1)) ** 2 / va ** 2)
    assert delta_interval(ranks, ("a", 2), ("absent", 2), [SET]) is None
