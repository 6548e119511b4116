"""Detection metrics and bootstrap CIs against independent computations (sklearn, hand-computed means)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from halsift.eval.metrics.bootstrap import bootstrap_auroc, weighted_auroc_batch
from halsift.eval.metrics.detection import (MetricError, auroc, auroc_by_generator, ensemble_gain, ensemble_scores,
                                    failure_rate, generator_table, mean_score_by_type, precision_at_keep,
                                    score_by_position, self_preference)


def scored_frame(n: int = 600, seed: int = 0, signal: float = 15.0, images: int | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    gens = np.array(["a", "b", "c", "x"])
    df = pd.DataFrame({"generator": rng.choice(gens, n),
                       "label": rng.choice(["correct", "incorrect", "unknown"], n, p=[0.6, 0.35, 0.05]),
                       "image_id": rng.integers(0, images or n // 4, n).astype(str),
                       "position": rng.integers(0, 4, n)})
    df["generator_type"] = np.where(df["generator"] == "x", "t2i", "i2t")
    df["score"] = np.round(rng.uniform(0, 100, n) + signal * (df["label"] == "correct"))  # ties on purpose
    return df


def test_auroc_matches_sklearn_and_scale():
    rng = np.random.default_rng(1)
    y = rng.choice(["correct", "incorrect"], 200)
    s = rng.integers(0, 10, 200).astype(float)
    assert auroc(y, s) == pytest.approx(100 * roc_auc_score(y == "correct", s))
    assert auroc(["correct", "incorrect"], [90, 10]) == 100.0
    assert auroc(["correct", "incorrect"], [10, 90]) == 0.0
    assert auroc([1, 0, 1, 0], [5, 5, 5, 5]) == 50.0


def test_auroc_errors_are_clear():
    with pytest.raises(MetricError, match="only one class"):
        auroc(["correct", "correct"], [1, 2])
    with pytest.raises(MetricError, match="unknown"):
        auroc(["correct", "unknown"], [1, 2])
    with pytest.raises(MetricError, match="missing"):
        auroc(["correct", "incorrect"], [1, float("nan")])


def test_auroc_by_generator_against_sklearn():
    df = scored_frame()
    got = auroc_by_generator(df)
    d = df[df["label"] != "unknown"]
    want = {g: 100 * roc_auc_score(x["label"] == "correct", x["score"]) for g, x in d.groupby("generator")}
    for g, v in want.items():
        assert got[f"auroc/{g}"] == pytest.approx(v)
    assert got["auroc/mean"] == pytest.approx(np.mean(list(want.values())))
    assert got["auroc/i2t"] == pytest.approx(np.mean([want[g] for g in "abc"]))
    assert got["auroc/t2i"] == pytest.approx(want["x"])


def test_one_class_generator_left_out_with_reason():
    df = scored_frame()
    df.loc[(df["generator"] == "x") & (df["label"] == "incorrect"), "label"] = "correct"
    got = auroc_by_generator(df)
    assert "auroc/x" not in got and "auroc/t2i" not in got
    assert got["auroc/mean"] == pytest.approx(np.mean([got[f"auroc/{g}"] for g in "abc"]))
    table = generator_table(df).set_index("generator")
    assert np.isnan(table.at["x", "auroc"]) and "only one class" in table.at["x", "note"]
    df["label"] = "correct"
    with pytest.raises(MetricError, match="no generator has both"):
        auroc_by_generator(df)


def test_failure_rate():
    assert failure_rate([True, False, True, True]) == 25.0  # a percentage, 0–100
    with pytest.raises(MetricError, match="^failure_rate: no scores$"):
        failure_rate([])


def test_type_and_position_means_by_hand():
    df = pd.DataFrame({
        "generator": ["g"] * 6, "generator_type": ["i2t"] * 6,
        "label": ["incorrect", "incorrect", "incorrect", "correct", "correct", "unknown"],
        "types": [["Number"], ["Number", "Direction"], ["Object"], [], [], ["Number"]],
        "score": [10.0, 30.0, 50.0, 80.0, 60.0, 0.0],
        "position": [0, 1, 1, 0, 1, 0],
    })
    t = mean_score_by_type(df, ["Object", "Number", "Direction", "Text"]).set_index("type")
    assert t.at["Number", "mean_score"] == 20.0 and t.at["Number", "n"] == 2  # unknown row excluded
    assert t.at["Direction", "mean_score"] == 30.0 and t.at["Object", "mean_score"] == 50.0
    assert t.at["Text", "n"] == 0 and np.isnan(t.at["Text", "mean_score"])
    p = score_by_position(df).set_index("position")
    assert p.at[0, "mean_correct"] == 80.0 and p.at[0, "mean_incorrect"] == 10.0
    assert p.at[1, "mean_correct"] == 60.0 and p.at[1, "mean_incorrect"] == 40.0
    assert p.at[0, "incorrect_rate"] == 50.0 and p.at[1, "incorrect_rate"] == pytest.approx(100 * 2 / 3)


def test_precision_at_keep_by_hand():
    df = pd.DataFrame({"generator": ["g"] * 10, "generator_type": ["i2t"] * 10,
                       "label": ["correct", "incorrect"] * 5, "score": np.arange(10.0)})
    # top 30% = scores 9, 8, 7 -> labels incorrect, correct, incorrect
    r = precision_at_keep(df, 0.3).iloc[0]
    assert r["n_kept"] == 3 and r["precision"] == pytest.approx(100 / 3) and r["base_rate"] == 50.0
    # ties at the cut count in expectation: keep 2 of [90, 50, 50, 50] where the tied 50s are 2/3 correct
    tie = pd.DataFrame({"generator": ["g"] * 4, "generator_type": ["i2t"] * 4, "score": [90.0, 50, 50, 50],
                        "label": ["incorrect", "correct", "correct", "incorrect"]})
    assert precision_at_keep(tie, 0.5).iloc[0]["precision"] == pytest.approx(100 * (0 + 2 / 3) / 2)
    with pytest.raises(MetricError, match=r"^keep: expected a share in \(0, 1\], got 0.0$"):
        precision_at_keep(df, 0.0)


def test_self_preference_and_ensembles():
    aur = {"d1": {"g1": 60.0, "g2": 80.0}, "d2": {"g1": 90.0, "g2": 70.0}}
    m = self_preference(aur, {"d1": "g1", "d2": "g2"})
    assert m.at["d1", "g1"] == pytest.approx(60 / 70) and m.at["d2", "g2"] == pytest.approx(70 / 80)
    with pytest.raises(MetricError, match="no scores"):
        self_preference(aur, {"d3": "g1"})
    assert ensemble_scores([[0, 50], [100, 70]]).tolist() == [50.0, 60.0]
    assert ensemble_gain({"auroc/g": 75.0}, [{"auroc/g": 70.0}, {"auroc/g": 72.0}]) == {"auroc/g": 3.0}
    with pytest.raises(MetricError, match="^ensemble: needs at least two members$"):
        ensemble_scores([[1, 2]])


def test_weighted_auroc_batch_matches_sklearn_weights():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 150).astype(bool)
    s = rng.integers(0, 8, 150).astype(float)
    w = rng.integers(0, 4, size=(5, 150))
    got = weighted_auroc_batch(y, s, w)
    want = [100 * roc_auc_score(y, s, sample_weight=w[i]) for i in range(5)]
    assert got == pytest.approx(want)
    assert np.isnan(weighted_auroc_batch(y, s, np.where(y, 1, 0)[None, :]))[0]


def test_bootstrap_ci_contains_estimate_narrows_and_is_seeded():
    small = scored_frame(n=400, seed=4)
    big = scored_frame(n=6000, seed=4)
    ci_s = bootstrap_auroc(small, n_boot=300, seed=0)
    ci_b = bootstrap_auroc(big, n_boot=300, seed=0)
    for df, ci in ((small, ci_s), (big, ci_b)):
        point = auroc_by_generator(df)
        assert set(ci) == set(point)
        for k, v in point.items():
            assert ci[k][0] <= v <= ci[k][1], k
    width = lambda c: c["auroc/mean"][1] - c["auroc/mean"][0]  # noqa: E731
    assert width(ci_b) < 0.5 * width(ci_s)
    assert bootstrap_auroc(small, n_boot=300, seed=0) == ci_s
    assert bootstrap_auroc(small, n_boot=300, seed=1) != ci_s


def test_bootstrap_resamples_images_not_sentences():
    # every image repeats its sentences 10 times: a sentence-level bootstrap would see 10x the data and give a
    # ~sqrt(10) narrower CI; the image-level bootstrap gives the same CI width as the unrepeated data.
    base = scored_frame(n=400, seed=5, images=400)
    base["image_id"] = np.arange(len(base)).astype(str)
    rep = pd.concat([base] * 10, ignore_index=True)
    w1 = np.diff(bootstrap_auroc(base, n_boot=400, seed=0)["auroc/mean"])[0]
    w10 = np.diff(bootstrap_auroc(rep, n_boot=400, seed=0)["auroc/mean"])[0]
    assert 0.75 < w10 / w1 < 1.33
    with pytest.raises(MetricError, match="image_id"):
        bootstrap_auroc(base.drop(columns="image_id"))
