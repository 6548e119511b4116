"""The cascade's plan, fitted on the corpus and frozen: which units the judge scores and where the rest land.

From the cheap scores of every corpus unit and the judge's scores of a uniform random sample (a hash of the unit,
:func:`in_sample`, so that calibration units are sampled by the same rule):

* the **cut** ``tau``: the judge score at the ``1 - keep`` quantile of the sample (where the selection will cut);
* the **band**: an interval ``[lo, hi]`` of cheap scores around the cheap cut (the cheap score at the ``1 - keep``
  quantile of the corpus). An isotonic fit (scikit-learn) of the sample's judge decision ``judge >= tau`` on the
  cheap score gives, per cheap score, the chance ``p`` that the judge would keep the unit; the band grows from the
  cheap cut, one distinct cheap score at a time, to the side whose next score is the more uncertain
  (``min(p, 1 - p)``, then the side with fewer units judged so far), while the judge calls it costs fit the budget
  left after the sample;
* the **map** of cheap scores onto the judge's scale: quantile matching (the cheap score at corpus quantile ``q`` goes
  to the sample's judge score at quantile ``q``), monotone, so units above the band land above ``tau`` and units below
  it below; blended with ``TIE_BREAK`` of the quantile itself (``(1 - w) * judge_q + w * 100 * q``), so that the
  cheap stage's order survives where the judge's scale is flat (a judge scoring 0 / 50 / 100 only).

Units in the band or the sample keep the judge's score; the others their mapped cheap score.

With ``agg`` ``mean`` or ``min`` (a selection of whole captions ranked by that aggregate of their sentence scores, as
the quickstart's), the unit of every decision is the caption: the sample is a hash of (seed, key), so a sampled
caption has all its sentences judged; the cut is the ``1 - keep`` quantile of the sampled captions' judge aggregates;
the band is an interval of the captions' cheap aggregates (a band caption has all its sentences judged); and a caption
the judge did not see gets its cheap aggregate's place on the judge's caption scale (a second quantile map, of
caption aggregates), its sentences shifted together so that their aggregate lands there (their spread kept, shrunk
only as far as 0-100 requires). A sentence-level band would spend the judge on sentences near the sentence cut,
whose captions the mean ranks anywhere.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from halsift.filtering.detectors.cascade import AGGS

QUANTILE_KNOTS = 1001  # points of the quantile map
TIE_BREAK = 0.01  # weight of the cheap score's corpus quantile in a mapped score: keeps the cheap order where the
# judge's scale is flat (a judge with few distinct scores maps many cheap scores to one value)


def caption_groups(keys: list[str]) -> tuple[np.ndarray, int]:
    """Per unit, the index of its caption (its key) among the distinct keys, and how many there are."""
    _, inv = np.unique(np.asarray(keys, dtype=object).astype(str), return_inverse=True)
    return inv.astype(np.int64), int(inv.max()) + 1 if len(inv) else 0


def aggregate(values: np.ndarray, groups: np.ndarray, n: int, agg: str) -> np.ndarray:
    """Per caption, ``agg`` (``mean`` or ``min``) of its units' ``values`` (NaN for a caption with no unit)."""
    v = np.asarray(values, np.float64)
    if agg == "mean":
        count = np.bincount(groups, minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.bincount(groups, weights=v, minlength=n) / count
    out = np.full(n, np.inf)
    np.minimum.at(out, groups, v)
    out[np.isinf(out)] = np.nan
    return out


def unit_sample(keys: list[str], sentence_index: np.ndarray | list[int], seed: int, rate: float, agg: str
                ) -> np.ndarray:
    """The cascade's random sample: :func:`in_sample` per unit, or per caption (every sentence of a sampled key)
    when the cascade's unit is the caption."""
    idx = np.zeros(len(keys), np.int64) if agg != "sentence" else sentence_index
    return in_sample(keys, idx, seed, rate)


def in_sample(keys: list[str], sentence_index: np.ndarray | list[int], seed: int, rate: float) -> np.ndarray:
    """Whether each unit is in the cascade's random sample: a hash of (seed, key, sentence index) below ``rate``
    (independent of order, rank and batch; the same rule for corpus and calibration units)."""
    from halsift.filtering.detectors.baselines import hash_uniform

    return np.array([hash_uniform(seed, "cascade\x00" + k, int(i)) < rate for k, i in zip(keys, sentence_index)],
                    bool)


@dataclass
class Plan:
    """A fitted cascade (all scores 0-100). ``band`` None: no unit is judged for the band."""

    spec: str
    units: int
    sample_rate: float
    seed: int
    keep: float
    budget: float
    cut: float
    cheap_cut: float
    band: tuple[float, float] | None
    cheap_knots: list[float]
    judge_knots: list[float]
    share_knots: list[float]
    sample_units: int
    band_calls: int
    # a set-level judge (an ensemble normalised over the scored set): its members' normalisation, fitted on the
    # sample and frozen (:func:`judge_norm_stats`), so the sample, the band and calibration units share one scale
    judge_norm: str = "none"
    judge_weights: list[float] | None = None
    judge_stats: list | None = None
    # whole captions (module docstring): the band and ``cut`` are on caption aggregates; ``caption_knots`` (x, y, q)
    # map a caption's cheap aggregate onto the judge's caption scale
    agg: str = "sentence"
    caption_knots: list | None = None
    # ``learn=``: the head that refines the cheap score (:class:`.cascade_learn.Learned`); every "cheap" score the
    # plan reads (cut, band, map) is then the refined one
    learned: dict | None = None

    def judge_scores(self, member_scores: np.ndarray) -> np.ndarray:
        """Member scores ``[units, members]`` -> the judge's score with the frozen normalisation."""
        return combine_frozen(member_scores, self.judge_norm, self.judge_weights, self.judge_stats)

    def mapped(self, cheap: np.ndarray) -> np.ndarray:
        """Cheap scores on the judge's scale (the quantile map with its tie-break; clamped at the ends)."""
        c = np.asarray(cheap, np.float64)
        return ((1 - TIE_BREAK) * np.interp(c, self.cheap_knots, self.judge_knots)
                + TIE_BREAK * 100.0 * np.interp(c, self.cheap_knots, self.share_knots))

    def in_band(self, cheap: np.ndarray) -> np.ndarray:
        """Whether each band value (:meth:`band_values`; a sentence cascade's: the cheap scores) is in the band."""
        c = np.asarray(cheap, np.float64)
        if self.band is None:
            return np.zeros(len(c), bool)
        return (c >= self.band[0]) & (c <= self.band[1])

    def band_values(self, keys: list[str], cheap: np.ndarray) -> np.ndarray:
        """Per unit, the value the band is an interval of: its cheap score, or its caption's cheap aggregate."""
        c = np.asarray(cheap, np.float64)
        if self.agg == "sentence":
            return c
        groups, n = caption_groups(keys)
        return aggregate(c, groups, n, self.agg)[groups]

    def judged(self, keys: list[str], sentence_index: np.ndarray, cheap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(in the sample, in the band) per unit, by the frozen rules."""
        sampled = unit_sample(keys, sentence_index, self.seed, self.sample_rate, self.agg)
        return sampled, self.in_band(self.band_values(keys, cheap))

    def standing(self, keys: list[str], cheap: np.ndarray) -> np.ndarray:
        """The score a unit the judge did not see stands with: its mapped cheap score; for whole captions, the
        caption's sentences shifted together so that their aggregate is the caption's mapped aggregate."""
        m = self.mapped(cheap)
        if self.agg == "sentence" or not len(m):
            return m
        groups, n = caption_groups(keys)
        x, y, q = self.caption_knots
        a = aggregate(np.asarray(cheap, np.float64), groups, n, self.agg)
        target = (1 - TIE_BREAK) * np.interp(a, x, y) + TIE_BREAK * 100.0 * np.interp(a, x, q)
        d = m - aggregate(m, groups, n, self.agg)[groups]  # each sentence's place in its caption
        t = target[groups]
        with np.errstate(divide="ignore", invalid="ignore"):
            room = np.where(d > 0, (100.0 - t) / d, np.where(d < 0, t / -d, np.inf))
        shrink = np.ones(n)
        np.minimum.at(shrink, groups, np.clip(room, 0.0, 1.0))
        return t + shrink[groups] * d

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        d = dict(d)
        d["band"] = None if d.get("band") is None else tuple(d["band"])
        return cls(**d)


def judge_norm_stats(norm: str, sample_members: np.ndarray) -> list | None:
    """Per member, the statistics of its normalisation over the sample: ``zscore`` (mean, std), ``rank`` the
    quantile knots of its scores (:data:`QUANTILE_KNOTS`); None for ``none``."""
    m = np.asarray(sample_members, np.float64)
    if norm == "zscore":
        return [[float(c.mean()), float(c.std())] for c in m.T]
    if norm == "rank":
        q = np.linspace(0.0, 1.0, QUANTILE_KNOTS)
        return [np.quantile(c, q).tolist() for c in m.T]
    return None


def sample_judge(judge_sample: np.ndarray, norm: str = "none", weights: list[float] | None = None
                 ) -> tuple[np.ndarray, list | None]:
    """The judge's score of each sample unit from its member scores (one per unit, or ``[units, members]``), and the
    normalisation statistics fitted on the sample that give it (:func:`judge_norm_stats`)."""
    members = np.asarray(judge_sample, np.float64).reshape(len(judge_sample), -1)
    stats = judge_norm_stats(norm, members)
    return combine_frozen(members, norm, weights, stats), stats


def combine_frozen(member_scores: np.ndarray, norm: str, weights: list[float] | None, stats: list | None
                   ) -> np.ndarray:
    """The ensemble's combination (:mod:`halsift.filtering.detectors.ensemble`) with normalisation statistics
    frozen from the sample instead of taken over the scored set: ``zscore`` maps ``clip(50 + 50 z / 3, 0, 100)``
    with the sample's mean and std, ``rank`` is 100 x the score's quantile among the sample's."""
    m = np.asarray(member_scores, np.float64).reshape(len(member_scores), -1)
    w = np.ones(m.shape[1]) if weights is None else np.asarray(weights, np.float64)
    cols = []
    for i in range(m.shape[1]):
        c = m[:, i]
        if norm == "zscore":
            mean, std = stats[i]
            c = np.clip(50.0 + 50.0 * ((c - mean) / std if std > 0 else 0.0 * c) / 3.0, 0.0, 100.0)
        elif norm == "rank":
            knots = np.asarray(stats[i], np.float64)
            ux, inv = np.unique(knots, return_inverse=True)
            share = np.bincount(inv, weights=np.linspace(0.0, 1.0, len(knots))) / np.bincount(inv)
            c = 100.0 * np.interp(c, ux, share)
        cols.append(c)
    return (np.stack(cols, 1) * w).sum(1) / w.sum()


def quantile_map(cheap: np.ndarray, judge_sample: np.ndarray, knots: int = QUANTILE_KNOTS
                 ) -> tuple[list[float], list[float], list[float]]:
    """Knots ``(x, y, q)`` of the monotone map sending the cheap score ``x`` at corpus quantile ``q`` to the judge's
    score ``y`` at sample quantile ``q``; repeated cheap knots are merged (their judge values and quantiles
    averaged) so that ``x`` increases."""
    q = np.linspace(0.0, 1.0, knots)
    x = np.quantile(np.asarray(cheap, np.float64), q)
    y = np.quantile(np.asarray(judge_sample, np.float64), q)
    ux, inv = np.unique(x, return_inverse=True)
    count = np.bincount(inv)
    uy = np.bincount(inv, weights=y) / count
    uq = np.bincount(inv, weights=q) / count
    return ux.tolist(), np.maximum.accumulate(uy).tolist(), uq.tolist()


def keep_chance(sample_cheap: np.ndarray, sample_kept: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Isotonic (non-decreasing) fit of the judge's keep decision on the cheap score, evaluated ``at``."""
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(increasing=True, y_min=0.0, y_max=1.0, out_of_bounds="clip")
    iso.fit(np.asarray(sample_cheap, np.float64), np.asarray(sample_kept, np.float64))
    return iso.predict(np.asarray(at, np.float64))


def choose_band(values: np.ndarray, cost: np.ndarray, uncertainty: np.ndarray, start: int, calls: int
                ) -> tuple[int, int] | None:
    """Indices ``[lo, hi]`` into the ascending distinct cheap ``values`` of the band: grown from ``start`` one value
    at a time to the side whose next value is the more uncertain (ties: the side with fewer units so far), while the
    ``cost`` (judge calls) of the values taken stays within ``calls``. None when even ``start`` does not fit."""
    if cost[start] > calls:
        return None
    lo = hi = start
    spent = int(cost[start])
    below = above = 0
    n = len(values)
    while True:
        sides = []
        if lo > 0 and spent + cost[lo - 1] <= calls:
            sides.append((-uncertainty[lo - 1], below, 0))
        if hi < n - 1 and spent + cost[hi + 1] <= calls:
            sides.append((-uncertainty[hi + 1], above, 1))
        if not sides:
            return lo, hi
        _, _, side = min(sides)
        if side == 0:
            lo -= 1
            spent += int(cost[lo])
            below += int(cost[lo])
        else:
            hi += 1
            spent += int(cost[hi])
            above += int(cost[hi])


def fit_plan(spec: str, cheap: np.ndarray, sampled: np.ndarray, judge_sample: np.ndarray, budget: float,
             keep: float, sample_rate: float, seed: int, judge_norm: str = "none",
             judge_weights: list[float] | None = None, keys: list[str] | None = None, agg: str = "sentence") -> Plan:
    """The plan (module docstring) from every corpus unit's ``cheap`` score, which of them are ``sampled`` and the
    judge's scores of those (in the same order): one score per unit, or ``[units, members]`` member scores of a
    set-level judge combined with ``judge_norm`` and ``judge_weights`` (statistics fitted on the sample). With
    ``agg`` ``mean``/``min`` the units' ``keys`` group them into captions (every sentence of a sampled caption
    sampled)."""
    if len(cheap) == 0 or len(judge_sample) == 0:
        raise ValueError(f"cascade: {len(cheap)} units and {len(judge_sample)} judged sample units: nothing to fit "
                         "(a larger budget or sample share gives the judge a sample)")
    if agg not in AGGS:
        raise ValueError(f"cascade: agg={agg!r}: expected one of {', '.join(AGGS)}")
    c = np.asarray(cheap, np.float64)
    sampled = np.asarray(sampled, bool)
    j, stats = sample_judge(judge_sample, judge_norm, judge_weights)
    if agg != "sentence" and keys is None:
        raise ValueError("cascade: a caption-level plan needs the units' keys")
    # the decisions are per group: each unit its own (agg sentence), or each caption (mean / min of its units)
    n = len(c)
    groups, ng = (np.arange(n), n) if agg == "sentence" else caption_groups(keys)
    judge_all = np.full(n, np.nan)
    judge_all[sampled] = j
    sampled_g = np.zeros(ng, bool)
    sampled_g[groups[sampled]] = True
    units = np.bincount(groups, minlength=ng)
    if (np.bincount(groups, weights=sampled, minlength=ng) != units)[sampled_g].any():
        raise ValueError("cascade: a caption-level sample must hold every sentence of a sampled caption")
    ca = c if agg == "sentence" else aggregate(c, groups, ng, agg)
    ja = judge_all[sampled] if agg == "sentence" else aggregate(judge_all, groups, ng, agg)[sampled_g]
    calls = max(0, math.floor(budget * n) - int(sampled.sum()))
    tau = float(np.quantile(ja, 1.0 - keep))
    desc = np.sort(ca)[::-1]
    cheap_cut = float(desc[min(ng - 1, math.floor(keep * ng))])
    values, inv = np.unique(ca, return_inverse=True)
    cost = np.bincount(inv, weights=np.where(sampled_g, 0, units), minlength=len(values)).astype(np.int64)
    p = keep_chance(ca[sampled_g], ja >= tau, values)
    band_idx = choose_band(values, cost, np.minimum(p, 1.0 - p), int(np.searchsorted(values, cheap_cut)), calls)
    band = None if band_idx is None else (float(values[band_idx[0]]), float(values[band_idx[1]]))
    x, y, q = quantile_map(c, j)
    plan = Plan(spec, n, sample_rate, seed, keep, budget, tau, cheap_cut, band, x, y, q, int(sampled.sum()), 0,
                judge_norm, judge_weights, stats, agg, None if agg == "sentence" else list(quantile_map(ca, ja)))
    plan.band_calls = int((plan.in_band(ca)[groups] & ~sampled).sum())
    return plan
