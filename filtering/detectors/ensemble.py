"""``ensemble``: weighted mean of member detectors' scores after optional normalisation (seeds' Table I/6).

Normalisations (``norm``), applied to each member's scores over the scored set before weighting:

* ``none``: raw 0–100 scores.
* ``rank``: ``100 * (average rank - 1) / (n - 1)`` (ties share their average rank; a single item gets 50).
* ``zscore``: ``(s - mean) / std`` (population std; a constant member contributes 0), then mapped back to
  0–100 by ``clip(50 + 50 * z / 3, 0, 100)`` so the result stays on the contract scale (monotone in z).

With ``norm=none`` an item's score depends only on that item. ``rank``/``zscore`` depend on the set: the
scoring runner therefore scores each member over the whole input and combines once at the end
(:func:`halsift.filtering.scoring.runner.score`, through the ``set-level`` capability);
:meth:`EnsembleDetector.score_batch` normalises over the batch it is given. ``parsed`` is true only where every
member parsed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata

from halsift.filtering.detectors.base import Detector, Item, Result

NORMS = ("none", "rank", "zscore")


def normalise(scores: np.ndarray, norm: str) -> np.ndarray:
    """Normalise one member's score vector (see module docstring)."""
    s = np.asarray(scores, dtype=np.float64)
    if norm == "none" or s.size == 0:
        return s
    if norm == "rank":
        if s.size == 1:
            return np.full(1, 50.0)
        return 100.0 * (rankdata(s, method="average") - 1) / (s.size - 1)
    if norm == "zscore":
        std = s.std()
        z = np.zeros_like(s) if std == 0 else (s - s.mean()) / std
        return np.clip(50.0 + 50.0 * z / 3.0, 0.0, 100.0)
    raise ValueError(f"norm={norm!r}: expected one of {NORMS}")


def combine(member_scores: np.ndarray, weights: Sequence[float], norm: str) -> np.ndarray:
    """Weighted mean over members (rows) of normalised scores; ``member_scores`` is [members, items]."""
    m = np.asarray(member_scores, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    normed = np.stack([normalise(row, norm) for row in m]) if m.size else m
    return (w[:, None] * normed).sum(0) / w.sum()


class EnsembleDetector(Detector):
    """Options: ``members`` (list of specs), ``weights`` (same length, >= 0, not all 0; default equal),
    ``norm`` (none|rank|zscore)."""

    family = "ensemble"

    # one line of help per spec option (docs/config.md, --describe); a test keeps it in step with __init__
    OPTION_HELP = {
        "members": "member detector specs (short specs separated by ';' or YAML entries)",
        "weights": "one weight per member (default: equal)",
        "norm": "none (weighted mean of scores) | rank | zscore (normalised over the whole scored set first)",
    }

    # the options' ranges, declared once: the dry run (check_spec), --describe and the build check them
    OPTION_RANGES = {"weights": "[0, inf)"}  # each weight; not all 0 (checked in __init__)

    def __init__(self, members: Sequence = (), weights: Sequence[float] | None = None, norm: str = "none") -> None:
        super().__init__()
        from halsift.filtering.detectors.spec import load_detector

        if not members or isinstance(members, (str, dict)):
            raise ValueError(f"members={members!r}: expected a non-empty list of detector specs")
        self.members = [load_detector(m) for m in members]
        if weights is None:
            weights = [1.0] * len(self.members)
        if isinstance(weights, (int, float)):
            weights = [weights]
        if len(weights) != len(self.members):
            raise ValueError(f"weights={list(weights)!r}: expected {len(self.members)} values, one per member")
        if any(not isinstance(w, (int, float)) or w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"weights={list(weights)!r}: expected non-negative numbers, not all zero")
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r}: expected one of {NORMS}")
        self.weights = [float(w) for w in weights]
        self.norm = norm
        self.set_level = norm != "none"  # rank/zscore normalise over the set: the runner combines once at the end
        self.needs_image = any(m.needs_image for m in self.members)

    def combine_scores(self, member_scores: np.ndarray) -> np.ndarray:
        """:func:`combine` with this ensemble's weights and norm (``[members, items]`` -> ``[items]``)."""
        return combine(member_scores, self.weights, self.norm)

    def to(self, device) -> "EnsembleDetector":
        for m in self.members:
            m.to(device)
        return self

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        results = [m.score_batch(items) for m in self.members]
        scores = np.array([[r.score for r in res] for res in results])
        combined = self.combine_scores(scores)
        parsed = [all(res[i].parsed for res in results) for i in range(len(items))]
        return [Result(float(s), p) for s, p in zip(combined, parsed)]
