"""Issue 32: selection with a guarantee (Learn-then-Test, fixed sequence, exact binomial bounds) and its refusals.
The handmade cases test the single fixed sequence (``method="sequence"``); test_guarantee_power.py the multi-start."""

from __future__ import annotations

import json
import re
from math import comb
from pathlib import Path

import numpy as np
import pytest
from filtering_data import make_bench, scored_corpus

from halsift.filtering.selection.guarantee import certify, labels_needed, upper_bound
from halsift.launch.cli import main

# a handmade calibration set: 30 units scored 100, 99, ..., 71; the units at these ranks (0 = best) hallucinated
SCORES = np.arange(100, 70, -1, dtype=float)
BAD = {11, 19, 20, 25, 26, 27}
HALLUCINATED = np.array([i in BAD for i in range(30)])


def binom_cdf(k: int, n: int, p: float) -> float:
    return sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def test_ltt_picks_the_loosest_threshold_of_the_fixed_sequence():
    # By hand, A = 0.2, delta = 0.1: a threshold that keeps n units with k hallucinated is certified when
    # P(Bin(n, 0.2) <= k) <= 0.1. n < 11 cannot certify even with k = 0 (0.8**10 = 0.107 > 0.1): skipped.
    # n = 11 (score 90): k = 0, 0.8**11 = 0.0859 -> rejected; n = 12 (score 89): k = 1, p = 0.2749 -> the sequence
    # stops. Threshold 90, although n = 18 and 19 (scores 83, 82) have p < 0.1 too: testing them after a failure
    # would spend the error budget twice.
    assert 0.8**10 > 0.1 >= 0.8**11
    assert binom_cdf(1, 12, 0.2) > 0.1 and binom_cdf(1, 19, 0.2) < 0.1
    g = certify(SCORES, HALLUCINATED, 0.2, 0.9, method="sequence")
    assert g.threshold == 90.0
    assert g.calibration_kept == 11 and g.estimate == 0.0 and g.tested == 2
    assert g.bound == pytest.approx(1 - 0.1 ** (1 / 11))  # Clopper-Pearson upper bound for 0 of 11
    assert g.manifest()["bound"] == pytest.approx(100 * (1 - 0.1 ** (1 / 11)), abs=1e-4)
    assert [s["threshold"] for s in g.steps] == [90.0, 89.0] and [s["rejected"] for s in g.steps] == [True, False]


def test_a_later_first_hallucination_buys_a_looser_threshold():
    # the first hallucination at rank 15: n = 11..15 have k = 0 -> rejected; n = 16, k = 1:
    # P(Bin(16, .2) <= 1) = 0.1407 > 0.1 -> stop at n = 15 (score 86)
    y = np.array([i in {15, 27, 28, 29} for i in range(30)])
    assert binom_cdf(1, 16, 0.2) > 0.1
    assert certify(SCORES, y, 0.2, 0.9, method="sequence").threshold == 86.0


def test_clopper_pearson_matches_the_binomial_tail():
    # the bound is the rate at which seeing <= k of n has probability 1 - C
    for k, n in [(0, 10), (3, 40), (7, 60)]:
        b = float(upper_bound(k, n, 0.9))
        assert binom_cdf(k, n, b) == pytest.approx(0.1, abs=1e-9)


def test_no_threshold_certifies_a_strict_rate_and_the_labels_needed_would():
    g = certify(SCORES, HALLUCINATED, 0.05, 0.9, method="sequence")  # needs n >= 45 at zero errors: 30 units cannot
    assert g.threshold is None and g.tested == 0
    bounds = [float(upper_bound(int(HALLUCINATED[:n].sum()), n, 0.9)) for n in range(1, 31)]
    assert g.best_bound == pytest.approx(min(bounds))
    # the labels needed: the top 11 (share 11/30) had rate 0: 45 clean kept units certify 5% -> 45 * 30 / 11
    assert g.labels_needed == int(np.ceil(45 * 30 / 11)) == 123
    assert labels_needed(np.array([3]), np.array([10]), 10, 0.2, 0.9) is None  # observed 30% >= 20%


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from halsift.filtering.scoring.runner import score_bench

    root = tmp_path_factory.mktemp("guarantee")
    corpus, scores = scored_corpus(root, shards=2, per_shard=20, seed=3)
    bench = make_bench(root / "bench", captions=80, seed=4)
    score_bench("random:seed=1", bench, root / "cal", show_progress=False)
    score_bench("random:seed=2", bench, root / "cal_other", show_progress=False)
    return corpus, scores, root


def _select(world, out: Path, *extra: str) -> int:
    corpus, scores, _ = world
    return main(["select", "--scores", str(scores), "--data", str(corpus), "--out", str(out), "--no-progress",
                 *extra])


def test_select_with_a_guarantee_records_it(world, tmp_path, capsys):
    from halsift.corpus.scores import read_scores
    from halsift.filtering.selection.calibration import load_calibration

    corpus, scores, root = world
    rc = _select(world, tmp_path / "sel", "--max-hallucination", "0.5", "--confidence", "0.9",
                 "--calibration", str(root / "cal"))
    assert rc == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    g = m["guarantee"]
    cal = load_calibration(root / "cal", {"name": "random", "spec": "random:seed=1"})
    want = certify(cal.scores, cal.hallucinated, 0.5, 0.9)
    assert g["threshold"] == want.threshold == m["threshold_used"]
    assert g["calibration_units"] == len(cal.scores) > 100
    assert g["max_hallucination"] == 50.0 and g["confidence"] == 90.0 and g["bound"] <= 50.0
    s = read_scores(scores, ["score"])["score"].to_numpy()
    assert g["kept"] == pytest.approx(100 * (s >= want.threshold).mean(), abs=1e-3)
    assert "guarantee: kept units hallucinated <= 50% with 90% confidence" in out


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


def test_refusal_names_the_best_bound_and_the_labels_needed(world, tmp_path, capsys):
    rc = _select(world, tmp_path / "sel", "--max-hallucination", "0.05", "--calibration", str(world[2] / "cal"))
    assert rc == 2
    err = _one_line_error(capsys)
    assert re.search(r"no threshold certifies a hallucination rate <= 5% at 90% confidence on the \d+ calibration "
                     r"units .*best bound reachable is [\d.]+%", err), err
    assert re.search(r"about \d+ labelled units|no number of labels would do", err), err
    assert not (tmp_path / "sel").exists()


@pytest.mark.parametrize("case, pattern", [
    ("other_detector", r"calibration: .*cal_other was scored by 'random:seed=2', the corpus by 'random:seed=1'"),
    ("no_labels", r"calibration: .*scores holds no labels"),
    ("bench_unscored", r"calibration: .*bench.jsonl is a bench without scores"),
    ("a_too_big", r"--max-hallucination: expected a value in \(0, 1\), got 1.5"),
    ("a_zero", r"--max-hallucination: expected a value in \(0, 1\), got 0.0"),
    ("no_calibration", r"--max-hallucination: needs calibration"),
])
def test_bad_guarantee_input_is_one_line(world, tmp_path, capsys, case, pattern):
    corpus, scores, root = world
    args = {"other_detector": ["--max-hallucination", "0.3", "--calibration", str(root / "cal_other")],
            "no_labels": ["--max-hallucination", "0.3", "--calibration", str(scores)],
            "bench_unscored": ["--max-hallucination", "0.3", "--calibration", str(root / "bench" / "bench.jsonl")],
            "a_too_big": ["--max-hallucination", "1.5", "--calibration", str(root / "cal")],
            "a_zero": ["--max-hallucination", "0", "--calibration", str(root / "cal")],
            "no_calibration": ["--max-hallucination", "0.3"]}[case]
    assert _select(world, tmp_path / "sel", *args) == 2
    assert re.search(pattern, _one_line_error(capsys))


def test_caption_guarantee_counts_a_caption_hallucinated_if_any_sentence_is(world):
    from halsift.corpus.bench import read_bench
    from halsift.filtering.selection.calibration import load_calibration

    root = world[2]
    cal = load_calibration(root / "cal", {"name": "random", "spec": "random:seed=1"}, unit="caption", agg="min")
    rows = read_bench(root / "bench" / "bench.jsonl")
    caps: dict[str, list[str]] = {}
    for r in rows:
        caps.setdefault(r.caption_id, []).append(r.label)
    full = [labs for labs in caps.values() if "incorrect" in labs or all(x == "correct" for x in labs)]
    assert len(cal.scores) == len(full)
    assert int(cal.hallucinated.sum()) == sum("incorrect" in labs for labs in full)


def test_the_report_row_is_the_kept_share_at_each_level(world):
    from halsift.corpus.scores import read_scores
    from halsift.eval.report.guaranteed import guaranteed_metrics, guaranteed_section
    from halsift.filtering.selection.calibration import load_calibration
    from halsift.filtering.selection.guaranteed import guaranteed_kept

    _, scores, root = world
    row = guaranteed_kept(scores, root / "cal", 0.9, levels=(0.05, 0.5))
    cal = load_calibration(root / "cal", {"name": "random", "spec": "random:seed=1"})
    t = certify(cal.scores, cal.hallucinated, 0.5, 0.9).threshold
    s = read_scores(scores, ["score"])["score"].to_numpy()
    assert row["5"] is None  # a random detector cannot certify 5 %
    assert row["50"] == pytest.approx(100 * (s >= t).mean(), abs=1e-3)
    assert guaranteed_metrics({"rand": row}) == {"rand/guaranteed_kept@50": row["50"]}
    text = guaranteed_section({"rand": row})
    assert "| filter | kept % at A = 5 % | kept % at A = 50 % |" in text
    assert f"| rand | - | {row['50']:.1f} |" in text
    # a '-' says how far the labels could go: the best bound any threshold reaches, on how many units
    best = certify(cal.scores, cal.hallucinated, 0.05, 0.9).best_bound
    assert row["units"] == len(cal.scores) and row["best_bound"] == pytest.approx(100 * best, abs=0.01)
    assert f"| {row['best_bound']:.1f} | {len(cal.scores)} |" in text
