"""A known world for the retrieval intervals of :mod:`halsift.eval.metrics.filter_delta`: two fine-tuned filters
whose expected R@5 differ by a set amount, with fine-tuning seed noise and query noise, written as the per-query
ranks of ``eval/retrieval_ranks.npz``. The coverage test (``tests/eval/test_seed_intervals.py``) and
``benchmarks/seed_interval_coverage.py`` draw many experiments from it.

Every query (an image for i2t, each of its captions for t2i) has a latent difficulty ``z``: a part all models share
(``shared``; a caption's is its image's with weight ``caption_share``), a part of its own per filter that every seed
of that filter keeps (``filter_query``) and a part per fine-tuning seed (``seed_query``), the shares summing to 1.
A seed of filter ``m`` shifts all its queries by ``u ~ N(0, tau^2)`` (``seed_sd`` in R@5 points at the reference's
R@5; seed ``s`` of two filters shares a part ``seed_correlation`` of its variance, 0 by default). A query is a hit
(rank 0, else rank ``MISS``) when ``z - u < t_m``; so a filter's expected hit rate over seeds and queries is
``Phi(t_m / sqrt(1 + tau^2))``, and ``t_m`` is set to make it exactly the reference's plus ``delta`` points, in both
directions: the truth is ``delta``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from halsift.eval.metrics.retrieval import ranks_key

SET = "synthetic"
MISS = 10  # the rank of a miss: >= 5, so never a hit at R@5
DIRECTIONS = ("i2t", "t2i")


@dataclass(frozen=True)
class NoiseWorld:
    """The world's sizes and noise (defaults: the quickstart's retrieval set, 400 images with 5 captions each,
    the reference near ``random``'s R@5 on world 0, query noise giving the paired-bootstrap intervals of
    docs/table_f.md, about ±2.5 points)."""

    images: int = 400
    captions: int = 5
    seeds: int = 2
    seed_sd: float = 0.7  # std of a seed's shift of R@5, points
    seed_correlation: float = 0.0  # correlation of seed s's shifts across filters (0: each shuffles its own data)
    reference: tuple[float, float] = (18.0, 15.0)  # the reference's expected i2t, t2i R@5 (%)
    shared: float = 0.3
    filter_query: float = 0.35
    seed_query: float = 0.35
    caption_share: float = 0.3

    def tau(self) -> float:
        """The seed shift's std in latent units: ``seed_sd`` points at the reference's mean R@5."""
        from scipy.stats import norm

        p = sum(self.reference) / 200
        return self.seed_sd / 100 / float(norm.pdf(norm.ppf(p)))

    def thresholds(self, delta: float) -> dict[str, float]:
        """Per direction, the hit threshold of a filter whose expected R@5 is the reference's plus ``delta``."""
        from scipy.stats import norm

        scale = math.sqrt(1 + self.tau() ** 2)
        return {d: scale * float(norm.ppf(p / 100 + delta / 100)) for d, p in zip(DIRECTIONS, self.reference)}


def simulate(world: NoiseWorld, deltas: dict[str, float], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One experiment: ranks (``ranks_key(name, seed, SET, direction)`` and ``SET/text_to_image``) of each filter
    in ``deltas`` (name -> its expected R@5 minus the reference's, points), each fine-tuned ``world.seeds`` times."""
    n_img, n_cap = world.images, world.images * world.captions
    t2i = np.repeat(np.arange(n_img), world.captions)
    image = rng.standard_normal(n_img)
    shared = {"i2t": image, "t2i": math.sqrt(world.caption_share) * image[t2i]
              + math.sqrt(1 - world.caption_share) * rng.standard_normal(n_cap)}
    ranks = {f"{SET}/text_to_image": t2i}
    tau, rho = world.tau(), world.seed_correlation
    common = rng.standard_normal(world.seeds)  # the part of seed s's shift every filter shares
    for name, delta in deltas.items():
        th = world.thresholds(delta)
        own = {d: rng.standard_normal(len(shared[d])) for d in DIRECTIONS}
        for s in range(world.seeds):
            shift = tau * (math.sqrt(rho) * common[s] + math.sqrt(1 - rho) * rng.standard_normal())
            for d in DIRECTIONS:
                z = (math.sqrt(world.shared) * shared[d] + math.sqrt(world.filter_query) * own[d]
                     + math.sqrt(world.seed_query) * rng.standard_normal(len(shared[d])))
                ranks[ranks_key(name, s, SET, d)] = np.where(z - shift < th[d], 0, MISS)
    return ranks
