"""Selection with a guarantee: the loosest score threshold whose kept units are at most ``A`` hallucinated, with
confidence ``C``, certified on labelled calibration units scored by the same detector.

The method is Learn-then-Test (Angelopoulos, Bates, Candès, Jordan, Lei 2021, "Learn then Test: Calibrating
Predictive Algorithms to Achieve Risk Control", arXiv:2110.01052). Each candidate threshold ``t`` (the distinct
calibration scores) has the null hypothesis "the hallucination rate of the units scoring >= t exceeds A". A null is
rejected when the exact one-sided Clopper-Pearson upper bound on the kept units' rate is <= A, i.e. when the binomial
tail p-value ``P(Binomial(n_t, A) <= k_t)`` is <= the level (``n_t`` calibration units kept, ``k_t`` of them
hallucinated). The loosest rejected threshold is chosen.

Which nulls are tested, ``method``:

- ``multistart`` (default): fixed-sequence testing from a few starts, Bonferroni over them (LTT's fixed sequence
  with multiple starts; a family-wise error bound by the union bound). The starts are the strictest thresholds
  keeping at least 0 (the strictest that could certify), 10, 25 and 50 % of the calibration units, chosen from the
  calibration scores alone (never the labels), duplicates dropped; from each start the thresholds are tested from
  strict to loose at level ``delta / m`` (``m`` starts) and that sequence stops at its first failure. One sequence
  stopped early by a handful of hallucinations among the strictest units no longer ends the search: a detector whose
  very top holds a few confident mistakes (a VLM judge) is still certified at the looser thresholds whose bound is
  below A. The price is the level: each test is at ``delta / m`` instead of ``delta``.
- ``sequence``: one fixed sequence from the strictest threshold at level ``delta`` (the method before issue 44).

Thresholds that keep so few calibration units that even zero hallucinations could not certify A (at the test's
level) are skipped before testing (that depends on the scores only, never on the labels), so a sequence does not
stop at its first step.

Assumption, stated plainly: the calibration units and the corpus units are exchangeable (drawn from the same
distribution, e.g. a uniform sample of the corpus, or a bench of the corpus's captioners on the corpus's image
distribution). A bench from other images or captioners gives a bound about that bench, not about the corpus.

A stratified sample (``halsift annotate``: strata of the corpus's score, each sampled uniformly, denser near likely
thresholds) is a sample of the corpus itself: the bound is then on the corpus's kept units as a finite population,
``sum_h (N_ht / N_t) * UCB_h``, each stratum's Clopper-Pearson bound at confidence ``1 - delta / H`` (Bonferroni over
the ``H`` strata), ``N_ht`` the corpus units of stratum ``h`` scoring >= t (counted from the corpus's scores). The
binomial bound is conservative for sampling without replacement (Hoeffding 1963). The point estimate reported beside
it is the inclusion-weighted (Horvitz-Thompson) rate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.stats import beta

from halsift.corpus.errors import InputError

MIN_LABELS_SEARCH = 10_000_000  # the largest number of labels :func:`labels_needed` searches up to
METHODS = ("multistart", "sequence")
# multistart: the kept shares of the calibration units (0: the strictest threshold that could certify) where a
# fixed sequence starts; fixed in advance, so at most 4 sequences, each at level delta / (number of sequences)
START_SHARES = (0.0, 0.1, 0.25, 0.5)


class GuaranteeError(InputError):
    """No threshold certifies the asked rate, or bad guarantee settings (one line for the user)."""


def check_levels(max_hallucination: float, confidence: float) -> None:
    """Raise :class:`GuaranteeError` unless both are fractions in (0, 1)."""
    for name, v in (("max_hallucination", max_hallucination), ("confidence", confidence)):
        if not (isinstance(v, (int, float)) and 0 < v < 1):  # also refuses nan
            raise GuaranteeError(f"{name}: expected a fraction in (0, 1), got {v}")


def upper_bound(k: np.ndarray | int, n: np.ndarray | int, confidence: float) -> np.ndarray:
    """Exact one-sided Clopper-Pearson upper confidence bound on a binomial rate (``k`` of ``n``); 1 where
    ``n`` is 0 or ``k == n``."""
    k, n = np.asarray(k, np.float64), np.asarray(n, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        b = beta.ppf(confidence, k + 1, np.maximum(n - k, 1e-300))
    return np.where((n <= 0) | (k >= n), 1.0, b)


@dataclass
class Strata:
    """A stratified calibration sample: each calibration unit's stratum and, per stratum, the corpus counts
    ``population[h]`` (all units) and the score edges ``[lo, hi)`` that define it."""

    stratum: np.ndarray  # per calibration unit, 0..H-1
    edges: list[float]  # H + 1 increasing score edges (the last one closes the top stratum)
    population: list[int]  # corpus units per stratum when the sample was drawn


@dataclass
class Guarantee:
    """What the calibration certifies (fractions 0-1 here; :meth:`manifest` writes percentages)."""

    max_hallucination: float
    confidence: float
    calibration_units: int
    threshold: float | None = None  # the loosest certified threshold (None: none)
    bound: float | None = None  # the upper bound on the kept units' hallucination rate at ``threshold``
    estimate: float | None = None  # the point estimate of that rate (weighted where the sample is stratified)
    calibration_kept: int | None = None  # calibration units scoring >= threshold
    tested: int = 0  # thresholds tested in all sequences (rejections + the failures that stopped them)
    design: str = "exchangeable"  # or "stratified"
    method: str = "multistart"  # or "sequence"
    sequences: int = 1  # fixed sequences run; each tested at level (1 - confidence) / sequences
    best_bound: float | None = None  # the lowest bound any threshold reaches (for the refusal line)
    best_threshold: float | None = None
    labels_needed: int | None = None  # about how many labels would certify A (None: no number would)
    steps: list[dict] = field(default_factory=list)

    def manifest(self) -> dict:
        """The manifest's ``guarantee`` block: levels and rates as percentages (0-100)."""
        pct = lambda x: None if x is None else round(100 * x, 4)  # noqa: E731
        d = asdict(self)
        d.pop("steps")
        for k in ("max_hallucination", "confidence", "bound", "estimate", "best_bound"):
            d[k] = pct(d[k])
        return {**d, "scale": 100}


def _zero_free(n: int, alpha: float, delta: float) -> bool:
    """Whether ``n`` units with no hallucination at all certify ``alpha`` at level ``delta``."""
    return n > 0 and (1 - alpha) ** n <= delta


def sequence_starts(n_t: np.ndarray, total: int, shares: tuple[float, ...] = START_SHARES) -> list[int]:
    """Where the fixed sequences start (indices into the strictest-first thresholds): per share ``q`` of
    :data:`START_SHARES`, the strictest threshold keeping at least ``q * total`` calibration units; duplicates
    dropped. It reads the calibration scores only, never the labels, so the number of sequences is fixed before
    any label is seen."""
    n_t = np.asarray(n_t)
    out: list[int] = []
    for q in shares:
        i = int(np.searchsorted(n_t, q * total, side="left"))
        if i < len(n_t) and i not in out:
            out.append(i)
    return out or [0]


def certify(scores: np.ndarray, hallucinated: np.ndarray, max_hallucination: float, confidence: float,
            strata: Strata | None = None, corpus_scores: np.ndarray | None = None,
            method: str = "multistart") -> Guarantee:
    """Learn-then-Test (module docstring): the loosest threshold whose kept calibration units certify
    ``max_hallucination`` at ``confidence``. ``method``: ``multistart`` (fixed sequences from the starts of
    :func:`sequence_starts`, Bonferroni over them) or ``sequence`` (one fixed sequence from the strictest
    threshold). ``strata`` (with the corpus's ``corpus_scores``): the stratified sample's bound.
    ``Guarantee.threshold`` is None when none certifies."""
    check_levels(max_hallucination, confidence)
    if method not in METHODS:
        raise GuaranteeError(f"guarantee method: expected one of {', '.join(METHODS)}, got {method!r}")
    s = np.asarray(scores, np.float64)
    y = np.asarray(hallucinated, bool)
    alpha, delta = float(max_hallucination), 1.0 - float(confidence)
    g = Guarantee(max_hallucination, confidence, len(s), design="stratified" if strata is not None else "exchangeable",
                  method=method)
    if not len(s):
        return g
    order = np.argsort(-s, kind="stable")
    s_sorted, y_sorted = s[order], y[order]
    thresholds = np.unique(s)[::-1]  # strictest first
    # n_t and k_t for every threshold: units scoring >= t
    n_t = np.searchsorted(-s_sorted, -thresholds, side="right")
    k_t = np.concatenate([[0], np.cumsum(y_sorted)])[n_t]
    starts = [0] if method == "sequence" else sequence_starts(n_t, len(s))
    g.sequences = len(starts)
    delta = delta / len(starts)  # Bonferroni over the sequences
    confidence = 1.0 - delta
    if strata is None:
        bounds = upper_bound(k_t, n_t, confidence)
        possible = np.array([_zero_free(int(n), alpha, delta) for n in n_t])
        est = k_t / np.maximum(n_t, 1)
    else:
        bounds, possible, est = _stratified(s, y, thresholds, strata, corpus_scores, confidence, alpha)
    chosen = None
    for start in starts:
        for i in np.flatnonzero(possible[start:]) + start:
            g.tested += 1
            ok = bool(bounds[i] <= alpha)
            g.steps.append({"start": int(start), "threshold": float(thresholds[i]), "kept": int(n_t[i]),
                            "hallucinated": int(k_t[i]), "bound": float(bounds[i]), "rejected": ok})
            if not ok:
                break
            chosen = i if chosen is None else max(chosen, i)
    best = int(np.argmin(bounds))
    g.best_bound, g.best_threshold = float(bounds[best]), float(thresholds[best])
    if chosen is not None:
        g.threshold, g.bound = float(thresholds[chosen]), float(bounds[chosen])
        g.estimate, g.calibration_kept = float(est[chosen]), int(n_t[chosen])
    else:
        g.labels_needed = labels_needed(k_t, n_t, len(s), alpha, confidence, starts)
    return g


def _stratified(s: np.ndarray, y: np.ndarray, thresholds: np.ndarray, strata: Strata, corpus: np.ndarray | None,
                confidence: float, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per threshold: the finite-population bound (module docstring), whether zero hallucinations could certify
    ``alpha``, and the weighted estimate."""
    if corpus is None:
        raise GuaranteeError("calibration: a stratified sample needs the corpus's scores")
    h_count = len(strata.population)
    edges = np.asarray(strata.edges, np.float64)
    corpus_h = np.clip(np.searchsorted(edges, corpus, side="right") - 1, 0, h_count - 1)
    per = 1 - (1 - confidence) / h_count
    bounds, possible, est = [], [], []
    for t in thresholds:
        total, b, b0, num, den = 0, 0.0, 0.0, 0.0, 0.0
        for h in range(h_count):
            big_n = int(((corpus_h == h) & (corpus >= t)).sum())
            if not big_n:
                continue
            in_h = (strata.stratum == h) & (s >= t)
            n, k = int(in_h.sum()), int(y[in_h].sum())
            total += big_n
            b += big_n * float(upper_bound(k, n, per))
            b0 += big_n * float(upper_bound(0, n, per))
            if n:
                num += big_n * k / n
                den += big_n
        bounds.append(b / total if total else 1.0)
        possible.append(bool(total) and b0 / total <= alpha)
        est.append(num / den if den else math.nan)
    return np.array(bounds), np.array(possible), np.array(est)


def labels_needed(k_t: np.ndarray, n_t: np.ndarray, total: int, alpha: float, confidence: float,
                  starts: tuple[int, ...] | list[int] = (0,)) -> int | None:
    """About how many calibration labels in all would certify ``alpha``: the least ``N`` above ``total`` at which
    the same procedure (fixed-sequence testing from each of ``starts``, at the corrected ``confidence``; thresholds
    skipped that zero errors could not certify) certifies, each threshold keeping the same share ``n_t / total`` at the same rate
    ``k_t / n_t`` (``k_t``, ``n_t`` strictest first). So it is never a number at or below the labels given. None
    when no threshold's observed rate is below ``alpha``, or none up to :data:`MIN_LABELS_SEARCH` would do."""
    k_t, n_t = np.asarray(k_t, np.float64), np.asarray(n_t, np.float64)
    if total <= 0 or not np.any((n_t > 0) & (k_t < alpha * n_t)):
        return None
    rates, shares, delta = k_t / np.maximum(n_t, 1), n_t / total, 1.0 - confidence

    def certifies(n: int) -> bool:
        for start in starts:  # any sequence whose first tested threshold passes certifies
            for rate, share in zip(rates[start:], shares[start:]):
                m = math.floor(share * n)
                if _zero_free(m, alpha, delta):  # the first threshold tested decides: the sequence stops if it fails
                    if upper_bound(math.floor(rate * m), m, confidence) <= alpha:
                        return True
                    break
        return False

    below, n = total, total + 1
    while not certifies(n):
        below, n = n, max(n + 1, int(n * 1.25))
        if n > MIN_LABELS_SEARCH:
            return None
    lo, hi = below + 1, n  # the least n in (below, hi] that certifies (the bounds fall as n grows: bisect)
    while lo < hi:
        mid = (lo + hi) // 2
        if certifies(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _pct(x: float, other: float) -> str:
    """``x`` as a percentage with the fewest decimals (1 to 4) that do not print it equal to ``other``."""
    for d in range(1, 5):
        if f"{100 * x:.{d}f}" != f"{100 * other:.{d}f}":
            break
    return f"{100 * x:.{d}f}%"


def refusal(g: Guarantee, source: str) -> str:
    """The one line when no threshold certifies ``A``: the best bound the procedure reaches (the first threshold the
    fixed sequence tests, where it stops), a lower bound further on that it cannot reach, and about how many labels
    in all would certify ``A`` (more than were given)."""
    a, c = 100 * g.max_hallucination, 100 * g.confidence
    head = (f"--max-hallucination {g.max_hallucination:g}: no threshold certifies a hallucination rate <= {a:g}% at "
            f"{c:g}% confidence on the {g.calibration_units} calibration units of {source}")
    if g.best_bound is None:
        return head + " (none)"
    alpha = g.max_hallucination
    if g.steps:  # every sequence stopped at its first test
        firsts: dict[int, dict] = {}
        for step in g.steps:
            firsts.setdefault(step.get("start", 0), step)
        first = min(firsts.values(), key=lambda step: step["bound"])
        where = ("the first tested, where the fixed sequence stops" if len(firsts) == 1 else
                 f"the best first test of the {len(firsts)} fixed sequences, where each stops")
        best = (f"; the best bound reachable is {_pct(first['bound'], alpha)} (threshold {first['threshold']:g}, "
                f"{first['kept']} units kept: {where})")
        if g.best_bound <= alpha:
            best += (f"; threshold {g.best_threshold:g} has a lower bound, {_pct(g.best_bound, alpha)}, but comes "
                     "after it")
    else:
        best = (f"; the best bound reachable is {_pct(g.best_bound, alpha)} (threshold {g.best_threshold:g}; even no "
                "hallucination at all could not certify A on so few units)")
    if g.labels_needed is None:
        return head + best + ("; no number of labels would do: at the observed rates the fixed sequence fails its "
                              "first threshold at any sample size")
    return head + best + (f"; about {g.labels_needed} labelled units in all ({g.calibration_units} given; at this rate "
                          "and score spread) would certify it")
