"""Fleiss' kappa against the textbook example (Fleiss 1971 as tabulated on Wikipedia: kappa = 0.210)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from halsift.eval.metrics.agreement import AgreementError, bench_agreement, fleiss_kappa

# 10 subjects, 14 raters, 5 categories (Wikipedia, "Fleiss' kappa", worked example)
WIKI = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]


def test_textbook_example():
    r = fleiss_kappa(WIKI)
    assert r["kappa"] == pytest.approx(0.210, abs=5e-4)
    assert r["p_bar"] == pytest.approx(0.378, abs=5e-4)
    assert r["p_e"] == pytest.approx(0.213, abs=5e-4)


def test_perfect_and_chance_agreement():
    assert fleiss_kappa([[3, 0], [0, 3], [3, 0]])["kappa"] == pytest.approx(1.0)
    # two raters who always disagree on a balanced binary item: P_bar = 0, p_e = 0.5 -> kappa = -1
    assert fleiss_kappa([[1, 1], [1, 1]])["kappa"] == pytest.approx(-1.0)


def test_bench_columns_and_skipped_rows():
    df = pd.DataFrame({"generator": ["a"] * 5 + ["b"] * 5,
                       "n_correct": [c[0] for c in WIKI], "n_incorrect": [c[1] for c in WIKI],
                       "n_unknown": [sum(c[2:]) for c in WIKI]})
    three = np.array([[c[0], c[1], sum(c[2:])] for c in WIKI])
    out = bench_agreement(df)
    assert out["agreement/kappa"] == pytest.approx(fleiss_kappa(three)["kappa"])
    assert out["agreement/kappa/a"] == pytest.approx(fleiss_kappa(three[:5])["kappa"])
    assert out["agreement/p_bar"] == pytest.approx(100 * fleiss_kappa(three)["p_bar"])  # observed agreement in %
    r = fleiss_kappa([[1, 0, 0], [2, 1, 0], [0, 3, 0]])
    assert r["n_skipped"] == 1 and r["n_subjects"] == 2
    with pytest.raises(AgreementError, match="two or more"):
        fleiss_kappa([[1, 0], [0, 1]])
    with pytest.raises(AgreementError, match="lack"):
        bench_agreement(df.drop(columns="n_unknown"))
