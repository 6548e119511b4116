"""The compare report beyond retrieval: zero-shot and compositional columns, gains over random with paired
bootstrap CIs from the per-sample hits, the markdown section and the gain plot."""

from __future__ import annotations

import json

import numpy as np
import pytest

from halsift.eval.report.beyond import add_beyond, bootstrap_gain
from halsift.eval.report.compare import compare_filters_report


def _hits(n_right: int, n: int = 40) -> np.ndarray:
    return np.arange(n) < n_right


def _beyond():
    """random: 20/40 top-1 hits per task and 20/40 right pairs; oracle: 30/40 and 36/40 (one seed each)."""
    runs = {"random": (50.0, 50.0), "oracle": (75.0, 90.0)}
    beyond = {name: [{"zeroshot/shape/acc1": zs, "zeroshot/count/acc1": zs, "zeroshot/acc1": zs,
                      "zeroshot/mean_per_class_recall": zs - 1, "compositional/swap_att": comp,
                      "compositional/mean": comp}] for name, (zs, comp) in runs.items()}
    hits = {}
    for name, (zs, comp) in runs.items():
        for task in ("shape", "count"):
            hits[f"{name}/0/zeroshot/{task}"] = _hits(int(zs * 0.4))
        hits[f"{name}/0/compositional/swap_att"] = _hits(int(comp * 0.4))
    return beyond, hits


def test_gain_over_random_and_its_paired_ci():
    beyond, hits = _beyond()
    reps = bootstrap_gain(hits, ("oracle", 1), ("random", 1), "compositional", n_boot=500)
    # oracle right on pairs 0-35, random on 0-19: the difference is 1 on 16 of 40 pairs, 0 elsewhere
    assert reps.shape == (500,) and reps.mean() == pytest.approx(40.0, abs=2.0) and reps.min() > 0
    rows = [{"filter": "random", "seeds": 1}, {"filter": "oracle", "seeds": 1}, {"filter": "no-tune", "seeds": 0}]
    keys = add_beyond(rows, beyond, hits, n_boot=500)
    assert "compositional/mean" in keys and "zeroshot/shape/acc1" in keys
    oracle = rows[1]
    assert oracle["delta_random/compositional/mean"] == pytest.approx(40.0)
    assert oracle["delta_random/zeroshot/acc1"] == pytest.approx(25.0)
    assert 0 < oracle["delta_random/compositional/mean/ci_low"] < 40 < oracle["delta_random/compositional/mean/ci_high"]
    assert np.isnan(oracle["delta_random/zeroshot/mean_per_class_recall/ci_low"])  # no hits for it: no CI
    assert np.isnan(rows[2]["compositional/mean"]) and np.isnan(rows[0]["delta_random/compositional/mean"])


def test_report_has_the_columns_the_section_and_the_plot(tmp_path):
    beyond, hits = _beyond()
    retrieval = {n: [{"s/i2t/r@5": r, "s/t2i/r@5": r}] for n, r in (("random", 30.0), ("oracle", 40.0))}
    m = compare_filters_report("t", retrieval, {}, {}, ["s"], tmp_path, wandb_mode="disabled", html=False,
                               beyond=beyond, beyond_hits=hits, n_boot=200)
    assert m["oracle/compositional/mean"] == 90.0 and m["oracle/delta_random/compositional/mean"] == 40.0
    assert m["oracle/zeroshot/acc1"] == 75.0 and "oracle/delta_random/zeroshot/acc1/ci_low" in m
    assert json.loads((tmp_path / "metrics.json").read_text()) == pytest.approx(m)
    md = (tmp_path / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| Filter"))
    assert "| zero-shot top-1 | compositional |" in header
    assert "## Beyond retrieval" in md and "| oracle | 75.0 | 75.0 | 75.0 | 74.0 | +25.0 [" in md
    assert "Compositional mean: 95% CI of the gain over random above 0 for `oracle`" in md
    assert (tmp_path / "gain_over_random.png").exists()
    # without the measures: no columns, no section, and the plot of an earlier report is removed
    compare_filters_report("t", retrieval, {}, {}, ["s"], tmp_path, wandb_mode="disabled", html=False)
    md = (tmp_path / "report.md").read_text()
    assert "zero-shot" not in md and not (tmp_path / "gain_over_random.png").exists()
