"""The guarantee's refusal does not contradict itself (issue 41): the bound it calls reachable is above A, a lower
bound further on is said to be unreachable, and the labels it asks for are more than were given and do certify."""

from __future__ import annotations

import re

import numpy as np
import pytest

from halsift.filtering.selection.guarantee import certify, labels_needed, refusal


def _case(bad_positions: list[int], clean_after: int = 200):
    """11 top units (the fewest that could certify 20% at 90%) with hallucinations at ``bad_positions``, then
    ``clean_after`` clean units: the first threshold tested fails, a looser one has a bound below A."""
    n = 11 + clean_after
    scores = np.linspace(100, 1, n)
    y = np.zeros(n, bool)
    y[bad_positions] = True
    return scores, y


def _numbers(line: str) -> dict:
    reach = float(re.search(r"best bound reachable is ([\d.]+)%", line).group(1))
    lower = re.search(r"has a lower bound, ([\d.]+)%", line)
    need = re.search(r"about (\d+) labelled units in all \((\d+) given", line)
    return {"reach": reach, "lower": float(lower.group(1)) if lower else None,
            "need": (int(need.group(1)), int(need.group(2))) if need else None}


@pytest.mark.parametrize("bad", [[3, 5, 7], [4, 8, 10], [2, 6, 9, 10], [10, 9, 8]])
def test_refusal_is_consistent(bad):
    """The single fixed sequence (``method="sequence"``) stops at its first threshold here; the multi-start default
    (issue 44) reaches the looser threshold that certifies."""
    s, y = _case(bad)
    assert certify(s, y, 0.2, 0.9).threshold is not None
    g = certify(s, y, 0.2, 0.9, method="sequence")
    assert g.threshold is None and g.best_bound <= 0.2  # a looser threshold's bound is below A, out of reach
    line = refusal(g, "cal")
    nums = _numbers(line)
    assert nums["reach"] > 20 and nums["lower"] is not None and nums["lower"] <= 20, line
    need, given = nums["need"]
    assert given == len(s) and need > given, line
    # independently: the calibration set replicated to at least that size (same shares and rates) certifies
    reps = -(-need // len(s))
    g2 = certify(np.repeat(s, reps), np.repeat(y, reps), 0.2, 0.9, method="sequence")
    assert g2.threshold is not None and g2.bound <= 0.2


def test_top_units_hallucinated_need_no_number_of_labels():
    s, y = _case([0, 1, 2])  # the strictest thresholds stay at rate >= 3/11 at any size
    g = certify(s, y, 0.2, 0.9)
    assert g.labels_needed is None
    line = refusal(g, "cal")
    assert "no number of labels would do" in line and "about" not in line


def test_labels_needed_is_never_at_or_below_the_given():
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(20, 300))
        s = rng.random(n)
        y = rng.random(n) < rng.uniform(0.02, 0.3)
        for alpha in (0.05, 0.1, 0.2):
            g = certify(s, y, alpha, 0.9)
            if g.threshold is None and g.labels_needed is not None:
                assert g.labels_needed > n
                assert str(g.labels_needed) in refusal(g, "x")
            if g.threshold is None:
                line = refusal(g, "x")
                assert _numbers(line)["reach"] > 100 * alpha or (not g.steps and g.best_bound > alpha)


def test_labels_needed_keeps_the_documented_case():
    assert labels_needed(np.array([3]), np.array([10]), 10, 0.2, 0.9) is None  # observed 30% >= 20%
    assert labels_needed(np.array([0]), np.array([10]), 10, 0.05, 0.9) == 45  # 45 clean units certify 5%
