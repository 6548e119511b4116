"""The compare-filters report opens with the answer (best detector, Δ over random / no-tune with a paired bootstrap
CI), adds R@5 / Δ columns, a dose-response plot and a Spearman correlation; per-query ranks agree with R@k."""

from __future__ import annotations

import json
import numpy as np
import pytest
from PIL import Image
from scipy.stats import spearmanr

from halsift.launch.recipe_config import Recipe
from halsift.eval.metrics.filter_delta import bootstrap_delta
from halsift.eval.report.compare import compare_filters_report
from halsift.eval.report.seed_spread import SEED_SD
from halsift.eval.metrics.retrieval import (NO_CAPTION_RANK, ranks_key, read_ranks, recall_at_k, recall_from_ranks,
                                    retrieval_ranks, write_ranks)

SET = "synthetic"
CAPS = 2  # captions per image


def fake_eval(hit_rates: dict[str, float], n_img: int, seeds: int = 3, rng_seed: int = 0
              ) -> tuple[dict[str, list[dict]], dict[str, np.ndarray]]:
    """retrieval.json and retrieval_ranks.npz contents for models whose queries hit (rank 0) with the given rate.

    An image and its captions share one draw (a hard image is hard both ways), so i2t and t2i are correlated."""
    rng = np.random.default_rng(rng_seed)
    t2i = np.repeat(np.arange(n_img), CAPS)
    ranks: dict[str, np.ndarray] = {f"{SET}/text_to_image": t2i}
    retrieval: dict[str, list[dict]] = {}
    for name, p in hit_rates.items():
        for i in range(1 if name == "no-tune" else seeds):
            u = rng.random(n_img)
            i2t = np.where(u < p, 0, 50)
            t2i_rank = np.where(np.clip(u[t2i] + rng.normal(0, 0.05, len(t2i)), 0, 1) < p, 0, 50)
            ranks[ranks_key(name, i, SET, "i2t")], ranks[ranks_key(name, i, SET, "t2i")] = i2t, t2i_rank
            metrics = recall_from_ranks(i2t, t2i_rank, (1, 5, 10))
            retrieval.setdefault(name, []).append({f"{SET}/{k}": v for k, v in metrics.items()})
    return retrieval, ranks


RATES = {"no-tune": 0.30, "random": 0.50, "oracle": 0.90, "clip": 0.52, "judge": 0.65}
PRECISION = {"random": 0.70, "clip": 0.74, "judge": 0.85, "oracle": 1.00}
FILTERS = ["clip", "judge", "random", "oracle"]


def selections(precision: dict[str, float]) -> dict[str, dict]:
    return {n: {"scale": 100, "precision": {"kept": 100 * v, "input": 70.0}, "kept_units": 100}
            for n, v in precision.items()}


def report(tmp_path, retrieval, ranks, precision=PRECISION, filters=FILTERS):
    bench = {f"{n}/auroc/mean": 50 + 50 * (v - 0.7) / 0.3 for n, v in precision.items()}
    metrics = compare_filters_report("t", retrieval, bench, selections(precision), [SET], tmp_path,
                                     wandb_mode="disabled", filters=filters, ranks=ranks)
    return metrics, (tmp_path / "report.md").read_text()


def r5(retrieval, name):
    return np.mean([(run[f"{SET}/i2t/r@5"] + run[f"{SET}/t2i/r@5"]) / 2 for run in retrieval[name]])


def test_headline_names_best_detector_with_ci_bracketing_the_truth(tmp_path):
    retrieval, ranks = fake_eval(RATES, n_img=3000)
    metrics, text = report(tmp_path, retrieval, ranks)
    lines = text.splitlines()
    assert lines[0] == "# Compare filters: t"
    # the answer comes right after the title; oracle has the highest R@5 but is a bound, not a detector
    assert lines[2].startswith("**Best detector filter: `judge`**")
    assert "3 fine-tuning seeds" in lines[2] and "does not beat" not in lines[2]
    assert "Welch-Satterthwaite" in text and "1000 replicates" in text
    want = r5(retrieval, "judge") - r5(retrieval, "random")
    assert metrics["judge/r@5"] == pytest.approx(r5(retrieval, "judge"))
    assert metrics["judge/delta_random/r@5"] == pytest.approx(want)
    q_lo, q_hi = metrics["judge/delta_random/ci_low"], metrics["judge/delta_random/ci_high"]
    assert 0 < q_lo < 15 < q_hi and q_lo < want < q_hi and q_hi - q_lo < 5  # true effect 100 * (0.65 - 0.50)
    # 3 seeds: the answer reads the interval over fine-tuning seeds and queries, wider than the queries' alone
    lo, hi = metrics["judge/delta_random/seeds_ci_low"], metrics["judge/delta_random/seeds_ci_high"]
    assert 0 < lo < q_lo and q_hi < hi and lo < 15 < hi
    assert (f"Over `random` it bought {want:+.1f} R@5 points (95% CI {lo:+.1f} to {hi:+.1f} over fine-tuning seeds "
            "and queries)") in lines[2]
    assert f"over the queries alone they would be {q_lo:+.1f} to {q_hi:+.1f} over `random`" in text
    lo_nt, hi_nt = metrics["judge/delta_no_tune/seeds_ci_low"], metrics["judge/delta_no_tune/seeds_ci_high"]
    assert lo_nt < 35 < hi_nt and f"over `no-tune` it bought" in lines[2]
    # table: R@5 and Δ vs random columns
    head = next(line for line in lines if line.startswith("| Filter"))
    cells = [c.strip() for c in head.split("|")[1:-1]]
    judge = [c.strip() for c in next(line for line in lines if line.startswith("| judge ")).split("|")[1:-1]]
    assert judge[cells.index("R@5")].startswith(f"{metrics['judge/r@5']:.1f} ± ")
    assert judge[cells.index("Δ vs random")] == f"{want:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    random_row = next(line for line in lines if line.startswith("| random "))
    assert random_row.split("|")[1 + cells.index("Δ vs random")].strip() == "–"


def test_small_true_effect_is_not_claimed_as_a_win(tmp_path):
    retrieval, ranks = fake_eval({**RATES, "judge": 0.52, "clip": 0.49}, n_img=400)
    metrics, text = report(tmp_path, retrieval, ranks)
    headline = text.splitlines()[2]
    lo, hi = metrics["judge/delta_random/ci_low"], metrics["judge/delta_random/ci_high"]
    assert metrics["judge/delta_random/r@5"] > 0 and lo < 0 < hi  # ahead on this sample, but within noise
    assert "It does not beat `random`" in headline and "which includes 0" in headline
    assert "bought" in headline  # it still beats no-tune by a lot


def test_detector_worse_than_random_says_so(tmp_path):
    retrieval, ranks = fake_eval({"no-tune": 0.3, "random": 0.6, "judge": 0.4}, n_img=1000)
    metrics, text = report(tmp_path, retrieval, ranks, {"random": 0.7, "judge": 0.6}, ["judge", "random"])
    assert metrics["judge/delta_random/ci_high"] < 0
    assert "It does not beat `random`" in text and "which is below 0" in text


def test_bootstrap_is_paired_seeded_and_zero_for_identical_models():
    retrieval, ranks = fake_eval({"random": 0.5, "judge": 0.6}, n_img=500)
    ranks.update({ranks_key("copy", i, SET, d): ranks[ranks_key("judge", i, SET, d)]
                  for i in range(3) for d in ("i2t", "t2i")})
    same = bootstrap_delta(ranks, ("judge", 3), ("copy", 3), [SET], n_boot=200)
    assert same.shape == (200,) and np.all(same == 0)
    a = bootstrap_delta(ranks, ("judge", 3), ("random", 3), [SET], n_boot=200, seed=1)
    assert np.array_equal(a, bootstrap_delta(ranks, ("judge", 3), ("random", 3), [SET], n_boot=200, seed=1))
    assert a.mean() == pytest.approx(r5(retrieval, "judge") - r5(retrieval, "random"), abs=1.0)
    assert bootstrap_delta(ranks, ("judge", 3), ("absent", 1), [SET]) is None
    # images are the resampling unit: the spread is the standard error of the per-image paired difference
    # (i2t hit + mean hit of its captions) / 2, averaged over seeds
    hits = {n: [np.mean([ranks[ranks_key(n, i, SET, d)] < 5 for i in range(3)], axis=0) for d in ("i2t", "t2i")]
            for n in ("judge", "random")}
    z = 50 * sum(hits["judge"][j].reshape(500, -1).mean(axis=1) - hits["random"][j].reshape(500, -1).mean(axis=1)
                 for j in (0, 1))
    reps = bootstrap_delta(ranks, ("judge", 3), ("random", 3), [SET], n_boot=2000)
    assert reps.std() == pytest.approx(z.std() / np.sqrt(500), rel=0.08)
    assert reps.mean() == pytest.approx(z.mean(), abs=0.2)


def table_row(lines: list[str], name: str) -> dict[str, str]:
    """One filter's row of the report's markdown table, by column name."""
    head = [c.strip() for c in next(line for line in lines if line.startswith("| Filter")).split("|")[1:-1]]
    cells = [c.strip() for c in next(line for line in lines if line.startswith(f"| {name} ")).split("|")[1:-1]]
    return dict(zip(head, cells))


def per_seed(retrieval, name):
    return [(run[f"{SET}/i2t/r@5"] + run[f"{SET}/t2i/r@5"]) / 2 for run in retrieval[name]]


def test_one_seed_answer_says_its_interval_covers_evaluation_sampling_only(tmp_path):
    retrieval, ranks = fake_eval(RATES, n_img=400, seeds=1)
    metrics, text = report(tmp_path, retrieval, ranks)
    headline = text.splitlines()[2]
    lo, hi = metrics["judge/delta_random/ci_low"], metrics["judge/delta_random/ci_high"]
    assert "averaged over 1 fine-tuning seed)" in headline
    assert f"(95% CI {lo:+.1f} to {hi:+.1f} over the queries only)" in headline
    # in the answer itself, with the measured seed spread and where it was measured
    assert ("With one fine-tuning seed, these intervals cover evaluation sampling only: between fine-tuning seeds "
            f"one filter's R@5 moves by {SEED_SD:.1f} points (std) on the quickstart's world (docs/table_f.md"
            ) in headline
    assert f"about ±{1.96 * np.sqrt(2) * SEED_SD:.1f} points at 95% on the difference of two filters" in headline
    assert "judge/delta_random/seeds_ci_low" not in metrics  # no seed variance to put in an interval
    assert metrics["judge/r@5/seed0"] == pytest.approx(per_seed(retrieval, "judge")[0])
    assert "judge/r@5/seed1" not in metrics
    assert table_row(text.splitlines(), "judge")["R@5 per seed"] == f"{per_seed(retrieval, 'judge')[0]:.1f}"


def test_two_seeds_answer_reads_the_interval_over_seeds_and_queries(tmp_path):
    retrieval, ranks = fake_eval(RATES, n_img=400, seeds=2)
    metrics, text = report(tmp_path, retrieval, ranks)
    lines = text.splitlines()
    headline = lines[2]
    lo, hi = metrics["judge/delta_random/seeds_ci_low"], metrics["judge/delta_random/seeds_ci_high"]
    assert "averaged over 2 fine-tuning seeds)" in headline
    assert f"bought {metrics['judge/delta_random/r@5']:+.1f} R@5 points (95% CI {lo:+.1f} to {hi:+.1f} over " \
           "fine-tuning seeds and queries)" in headline
    assert "evaluation sampling only" not in headline and "over the queries only" not in headline
    assert metrics["judge/delta_random/seeds_df"] > 1  # Welch-Satterthwaite: two filters' seeds and the queries
    assert metrics["judge/delta_no_tune/seeds_ci_low"] < metrics["judge/delta_no_tune/r@5"]  # no-tune: no seeds
    for name in ("judge", "random", "no-tune"):
        want = per_seed(retrieval, name)
        assert [metrics[f"{name}/r@5/seed{i}"] for i in range(len(want))] == pytest.approx(want)
        assert table_row(lines, name)["R@5 per seed"] == ", ".join(f"{v:.1f}" for v in want)
    assert len(per_seed(retrieval, "judge")) == 2 and len(per_seed(retrieval, "no-tune")) == 1


def test_page_draws_a_dot_per_seed_for_each_filter(tmp_path):
    import re

    retrieval, ranks = fake_eval(RATES, n_img=200, seeds=2)
    report(tmp_path, retrieval, ranks)
    html = (tmp_path / "index.html").read_text()
    values = {n: per_seed(retrieval, n) for n in retrieval}
    lo, hi = min(min(v) for v in values.values()), max(max(v) for v in values.values())
    for name, vals in values.items():
        row = re.search(rf'<tr data-filter="{re.escape(name)}">(.*?)</tr>', html, re.S).group(1)
        svg = re.search(r'<svg class="dots"[^>]*aria-label="per seed: ([^"]*)"[^>]*>(.*?)</svg>', row, re.S)
        assert svg.group(1).startswith(", ".join(f"{v:.1f}" for v in vals)), name
        xs = [float(x) for x in re.findall(r'<circle cx="([\d.]+)"', svg.group(2))]
        assert len(xs) == len(vals), name  # one dot per fine-tuning seed
        # one scale for every filter: left to right as the values
        assert xs == pytest.approx([4 + 92 * (v - lo) / (hi - lo) for v in vals], abs=0.06), name


def test_metrics_keys_spearman_and_plots(tmp_path):
    retrieval, ranks = fake_eval({**RATES, "oracle@0.1": 0.05}, n_img=300)
    precision = {**PRECISION, "oracle@0.1": 1.0}  # a selection variant: cleanest, far smaller, worst recall
    metrics, text = report(tmp_path, retrieval, ranks, precision)
    assert "oracle@0.1/r@5" in metrics  # reported as a row, but left out of the correlation
    for key in ("judge/synthetic/i2t/r@5", "judge/synthetic/t2i/r@5", "judge/kept_precision", "judge/auroc/mean",
                "judge/r@5", "no-tune/r@5", "spearman/kept_precision_vs_r@5"):
        assert key in metrics, key
    for ref in ("delta_random", "delta_no_tune"):
        for part in ("r@5", "ci_low", "ci_high"):
            assert f"judge/{ref}/{part}" in metrics and f"clip/{ref}/{part}" in metrics
    assert json.loads((tmp_path / "metrics.json").read_text()) == pytest.approx(metrics)
    names = [n for n in FILTERS]
    want = spearmanr([PRECISION[n] for n in names], [r5(retrieval, n) for n in names]).statistic
    assert metrics["spearman/kept_precision_vs_r@5"] == pytest.approx(want)
    assert f"across the 4 filters with both: ρ = {want:.2f}" in text
    assert "`dose_response.png`" in text
    for png in ("r_at_k.png", "auroc_vs_recall.png", "dose_response.png"):
        assert (tmp_path / png).stat().st_size > 0
        Image.open(tmp_path / png).verify()


def test_without_ranks_falls_back_to_seed_std(tmp_path):
    retrieval, _ = fake_eval(RATES, n_img=300)
    metrics, text = report(tmp_path, retrieval, None)
    headline = text.splitlines()[2]
    assert headline.startswith("**Best detector filter: `judge`**") and "std over seeds, no CI" in headline
    assert "No per-query ranks" in text and "95% CI" not in headline
    assert "judge/delta_random/r@5" in metrics and "judge/delta_random/std" in metrics
    assert "judge/delta_random/ci_low" not in metrics
    assert (tmp_path / "dose_response.png").stat().st_size > 0


def test_no_detector_only_bounds(tmp_path):
    retrieval, ranks = fake_eval({"no-tune": 0.3, "random": 0.5, "oracle": 0.9}, n_img=100)
    _, text = report(tmp_path, retrieval, ranks, {"random": 0.7, "oracle": 1.0}, ["random", "oracle"])
    assert text.splitlines()[2].startswith("**No detector filter was fine-tuned")


def test_stage_report_reads_ranks_npz(tmp_path):
    from halsift.launch.stages import Paths
    from halsift.launch.stages.report import stage_report

    retrieval, ranks = fake_eval(RATES, n_img=300)
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "retrieval.json").write_text(json.dumps(retrieval))
    write_ranks(run / "eval" / "retrieval_ranks.npz", ranks)
    loaded = read_ranks(run / "eval" / "retrieval_ranks.npz")
    assert loaded.keys() == ranks.keys() and all(np.array_equal(loaded[k], ranks[k]) for k in ranks)
    for name, prec in PRECISION.items():
        (run / "select" / name).mkdir(parents=True)
        (run / "select" / name / "manifest.json").write_text(json.dumps({"precision": {"kept": prec}}))
        (run / "score" / name).mkdir(parents=True)
    r = Recipe(name="t")
    r.wandb.mode, r.eval.bench_split = "disabled", ""
    r.score.detectors, r.score.ensembles = {n: "" for n in FILTERS}, {}
    p = Paths(run, "", "", {SET: "unused"}, "", "")
    metrics = stage_report(r, p)["metrics"]
    assert "judge/delta_random/ci_low" in metrics
    assert "95% CI" in (run / "report" / "report.md").read_text().splitlines()[2]


@pytest.mark.parametrize("seed", [0, 1])
def test_ranks_agree_with_recall_at_k_and_sorting(seed):
    rng = np.random.default_rng(seed)
    n_img, dim = 30, 6
    t2i = np.repeat(np.arange(n_img - 1), rng.integers(1, 4, size=n_img - 1))  # last image has no caption
    img = rng.normal(size=(n_img, dim))
    txt = img[t2i] + rng.normal(scale=1.2, size=(len(t2i), dim))
    i2t_rank, t2i_rank = retrieval_ranks(img, txt, t2i)
    ks = (1, 3, 5, 10)
    assert recall_from_ranks(i2t_rank, t2i_rank, ks) == recall_at_k(img, txt, t2i, ks)
    # against an argsort of the cosine similarities (no ties with continuous embeddings)
    sim = (img / np.linalg.norm(img, axis=1, keepdims=True)) @ (txt / np.linalg.norm(txt, axis=1, keepdims=True)).T
    order = np.argsort(-sim, axis=1)
    for i in range(n_img - 1):
        assert i2t_rank[i] == np.flatnonzero(t2i[order[i]] == i).min()
    assert i2t_rank[-1] == NO_CAPTION_RANK
    order_t = np.argsort(-sim.T, axis=1)
    assert np.array_equal(t2i_rank, np.argmax(order_t == t2i[:, None], axis=1))


def test_evaluate_retrieval_returns_ranks(tmp_path):
    import torch

    from halsift.corpus.retrieval import write_retrieval
    from halsift.eval.metrics.retrieval import evaluate_retrieval

    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    rows = []
    for i, c in enumerate(colors):
        Image.new("RGB", (4, 4), c).save(tmp_path / f"{i}.png")
        rows.append({"image": f"{i}.png", "captions": [f"c{i}", f"c{i}"]})
    write_retrieval(tmp_path / "retrieval.jsonl", rows)

    class Model(torch.nn.Module):  # image -> its mean colour; caption "cI" -> colour I
        def encode_image(self, x):
            return x.mean(dim=(2, 3))

        def encode_text(self, toks):
            return torch.tensor([colors[int(t)] for t in toks], dtype=torch.float32)

    def preprocess(im):
        return torch.tensor(np.asarray(im), dtype=torch.float32).permute(2, 0, 1)

    def tokenizer(caps):
        return torch.tensor([int(c[1:]) for c in caps])

    metrics, rk = evaluate_retrieval(Model(), preprocess, tokenizer, tmp_path, return_ranks=True)
    assert metrics["i2t/r@1"] == metrics["t2i/r@1"] == 100.0
    assert np.array_equal(rk["text_to_image"], [0, 0, 1, 1, 2, 2])
    assert np.all(rk["i2t"] == 0) and np.all(rk["t2i"] == 0)
    assert evaluate_retrieval(Model(), preprocess, tokenizer, tmp_path) == metrics
