"""benchmarks/table_f.py: claims per world x fine-tuning seed, from each seed's own models, and the findings
beyond retrieval."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _table_f():
    spec = importlib.util.spec_from_file_location("table_f", ROOT / "benchmarks" / "table_f.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_per_finetune_seed_claims_and_findings(tmp_path):
    tf = _table_f()
    r5 = {"no-tune": [10.0], "random": [20.0, 22.0], "oracle": [30.0, 23.0], "judge": [25.0, 21.0],
          "clip-lora": [21.0, 24.0], "clip": [19.0, 20.0]}
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "retrieval.json").write_text(json.dumps(
        {n: [{"s/i2t/r@5": v - 1, "s/t2i/r@5": v + 1, "s/retrieval/images": 20.0} for v in vs]
         for n, vs in r5.items()}))
    (tmp_path / "eval" / "beyond.json").write_text(json.dumps(
        {"random": [{"zeroshot/acc1": 40.0, "compositional/mean": 50.0}] * 2,
         "oracle": [{"zeroshot/acc1": 41.0, "compositional/mean": 56.0}, {"zeroshot/acc1": 38.0,
                                                                          "compositional/mean": 52.0}]}))
    prec = {"random": 60.0, "oracle": 100.0, "judge": 80.0, "clip-lora": 70.0, "clip": 55.0}
    report = {f"{n}/kept_precision": p for n, p in prec.items()}
    cells = tf.per_finetune_seed(tmp_path, report)
    assert [c["oracle/r@5"] for c in cells] == [30.0, 23.0] and [c["no-tune/r@5"] for c in cells] == [10.0, 10.0]
    m0, m1 = (tf.claim_margins(c) for c in cells)
    assert m0["oracle - random >= 3"] == (True, pytest.approx(7.0))
    assert m1["oracle - random >= 3"] == (False, pytest.approx(-2.0))  # seed 1: oracle 23 vs random 22
    assert m0["best trained detector > random"] == (True, pytest.approx(5.0))
    assert m1["best trained detector > random"] == (True, pytest.approx(2.0))  # clip-lora 24 on seed 1
    # seed 0: R@5 ranks clip < random < clip-lora < judge < oracle, as precision does: rho = 1
    assert m0["spearman(kept precision, R@5) >= 0.6"] == (True, pytest.approx(0.4))
    f1 = tf.findings(cells[1])
    assert f1["oracle - random, zero-shot top-1"] == pytest.approx(-2.0)
    assert f1["oracle - random, compositional"] == pytest.approx(2.0)
    assert tf.spread([7.0, -2.0]) == "+2.50 ± 6.36 (min -2.00)"


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def noise_run(run: Path, seeds: int) -> tuple[dict, dict]:
    """A run folder's eval/ (retrieval.json, retrieval_ranks.npz) from the known world of synth/retrieval_noise.py:
    judge +4 and clip-lora +1 R@5 points over random, seed noise as on the judge's world 21; and its report's
    metrics."""
    from dataclasses import replace

    import numpy as np

    from halsift.eval.metrics.retrieval import ranks_key, recall_from_ranks, write_ranks
    from halsift.eval.report.compare import compare_filters_report
    from halsift.synth.retrieval_noise import SET, NoiseWorld, simulate

    world = replace(NoiseWorld(), seeds=seeds, seed_sd=1.3)
    ranks = simulate(world, {"judge": 4.0, "clip-lora": 1.0, "random": 0.0, "no-tune": -3.0},
                     np.random.default_rng(5))
    ranks = {k: v for k, v in ranks.items() if not k.startswith("no-tune/") or k.startswith("no-tune/0/")}
    retrieval = {n: [{f"{SET}/{k}": v for k, v in recall_from_ranks(
        ranks[ranks_key(n, i, SET, "i2t")], ranks[ranks_key(n, i, SET, "t2i")], (5,)).items()}
        for i in range(1 if n == "no-tune" else seeds)] for n in ("no-tune", "random", "clip-lora", "judge")}
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "retrieval.json").write_text(json.dumps(retrieval))
    write_ranks(run / "eval" / "retrieval_ranks.npz", ranks)
    metrics = compare_filters_report("t", retrieval, {}, {}, [SET], run / "report", wandb_mode="disabled",
                                     filters=["clip-lora", "judge", "random"], ranks=ranks, html=False)
    return ranks, metrics


@pytest.mark.parametrize("seeds", [1, 2])
def test_benchmarks_read_a_difference_as_the_report_does(tmp_path, seeds):
    tf, ct = _table_f(), _benchmark("cascade_table")
    _, metrics = noise_run(tmp_path, seeds)
    lines = (tmp_path / "report" / "report.md").read_text().splitlines()
    best, lo, hi, kind = tf.best_trained_interval(metrics)
    assert best == "judge" and kind == ("seeds" if seeds > 1 else "queries")
    key = "seeds_ci" if seeds > 1 else "ci"
    assert (lo, hi) == (metrics[f"judge/delta_random/{key}_low"], metrics[f"judge/delta_random/{key}_high"])
    assert f"95% CI {lo:+.1f} to {hi:+.1f}" in lines[2]  # the report's answer states the same interval
    assert ct.paired_interval(tmp_path, "judge", "random", seeds) == pytest.approx((lo, hi))
    changes = {(c["filter"], c["reference"]): c for c in tf.interval_changes(metrics)}
    assert set(changes) == {(n, r) for n in ("clip-lora", "judge", "random", "no-tune") for r in ("random", "no-tune")
                            if n != r}
    assert changes["judge", "random"]["read"] == (lo, hi)
    if seeds == 1:
        assert not any(c["changed"] for c in changes.values())  # one seed: the report reads the query interval
    sd, df = tf.pooled_seed_sd([metrics])
    want = [[metrics[f"{n}/r@5/seed{i}"] for i in range(seeds)] for n in ("random", "clip-lora", "judge")]
    assert df == 3 * (seeds - 1)
    if seeds > 1:  # no-tune has no seeds: left out
        assert sd == pytest.approx((sum(statistics.variance(v) for v in want) / 3) ** 0.5)


def test_interval_changes_marks_a_conclusion_the_seeds_overturn():
    tf = _table_f()
    m = {"judge/seeds": 2, "random/seeds": 2, "no-tune/seeds": 1, "judge/delta_random/r@5": 2.0,
         "judge/delta_random/std": 1.0, "judge/delta_random/ci_low": 0.5, "judge/delta_random/ci_high": 3.5,
         "judge/delta_random/seeds_ci_low": -1.0, "judge/delta_random/seeds_ci_high": 5.0,
         "judge/delta_no_tune/r@5": 9.0, "judge/delta_no_tune/std": 1.0, "judge/delta_no_tune/ci_low": 7.0,
         "judge/delta_no_tune/ci_high": 11.0, "judge/delta_no_tune/seeds_ci_low": 5.0,
         "judge/delta_no_tune/seeds_ci_high": 13.0}
    changes = {(c["filter"], c["reference"]): c for c in tf.interval_changes(m)}
    assert set(changes) == {("judge", "random"), ("judge", "no-tune")}
    assert changes["judge", "random"]["changed"] and changes["judge", "random"]["read"] == (-1.0, 5.0)
    assert not changes["judge", "no-tune"]["changed"]
    assert tf.conclusion(0.5, 3.5) == "above 0" and tf.conclusion(-1.0, 5.0) == "includes 0"
    assert tf.conclusion(-3.0, -1.0) == "below 0"
