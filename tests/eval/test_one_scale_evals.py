"""One scale for the evaluations (issue 30): VOPE's rates and VIGIL's F1 are percentages on hand-made cases; every
key of a small ``eval bench`` / ``ihalla`` / ``vope`` / ``vigil`` run's metrics.json is classified as a percentage
(0–100, none left as a share) or as a named non-percentage; metrics of an earlier halsift (shares, no ``scale``)
are read as percentages or flagged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from halsift.corpus.percent import matches
from halsift.eval.metrics.vope import VopeRecord, vope_metrics
from halsift.eval.runs.bench_eval import evaluate_bench, read_bench_metrics
from halsift.launch.cli import main

# every percentage a user reads in an eval's metrics.json (fnmatch; ``*`` spans ``/``)
PERCENT = {
    "auroc": ("auroc/*", "*/auroc/*", "auroc_lo/*", "*/auroc_lo/*", "auroc_hi/*", "*/auroc_hi/*"),
    "precision@k": ("*precision@*",), "base rate": ("*base_rate/*",), "incorrect rate": ("bench/incorrect_rate/*",),
    "failure rate": ("failure_rate", "failure_rate/*"), "localization": ("*localization/ap*", "*localization/miou*"),
    "observed agreement": ("agreement/p_bar",),
    "VOPE": ("*/hal_d", "*/hal_i", "*/exp", "*/chair_i", "*/unparsed_rate", "*/defaulted_rate"),
    "VIGIL F1": ("f1/*", "baseline/*"), "VIGIL prevalence": ("prevalence/*",),
    "I-HallA true error (synthetic)": ("true_error/*",),
}
POINTS = ("*/auroc_gain/*",)  # differences of two percentages: percentage points, -100..100
NOT_PERCENT = (  # counts, 0–100 scores that are not shares, coefficients, and I-HallA's scores on its paper's 0–1
    "scale", "records", "*n_scored", "*n_missing", "bench/n_*", "*/n/*", "*type_score/*", "*position/*",
    "agreement/kappa*", "self_preference/*", "ihalla/*", "ihalla_strict/*", "correlation/*", "parse/differs*",
    "parse/no_punct_replies", "*/relevance/*", "rank/*")


def _record(image_id: str, d_t: int, d_h: int, i_t: int, i_h: int, unparsed: int = 0, defaulted: int = 0) -> VopeRecord:
    objs = {s: [f"{s}{i}" for i in range(n)] for s, n in (("D_T", d_t), ("D_H", d_h), ("I_T", i_t), ("I_H", i_h))}
    return VopeRecord("m", "story", image_id, objs, [f"u{i}" for i in range(unparsed)], {}, objs["D_H"][:defaulted])


def test_vope_rates_of_handmade_records_are_percentages(tmp_path):
    from halsift.eval.runs.vope import VopeEvalConfig, VopeRecords, run_vope

    # D_T 3, D_H 1, I_T 3, I_H 1 over two responses; 2 re-checks unparsed, 1 defaulted: 10 objects mentioned
    records = [_record("i1", 2, 1, 1, 0, unparsed=2, defaulted=1), _record("i2", 1, 0, 2, 1)]
    m = vope_metrics(records)
    assert (m["m/story/hal_d"], m["m/story/hal_i"], m["m/story/exp"], m["m/story/chair_i"]) == (25.0, 25.0, 50.0, 50.0)
    assert (m["m/story/unparsed_rate"], m["m/story/defaulted_rate"]) == (20.0, 10.0)
    assert m["m/all/hal_d"] == 25.0
    res = run_vope(VopeEvalConfig(out=str(tmp_path / "vope")), VopeRecords(records, "hand-made"))
    written = json.loads((tmp_path / "vope" / "metrics.json").read_text())
    assert written["scale"] == 100 and written["m/story/hal_d"] == 25.0 and written["m/story/unparsed_rate"] == 20.0
    assert "| m | story | 3 | 1 | 3 | 1 | 25.0 | 25.0 | 50.0 | 50.0 |" in res.report.read_text()
    assert res.summary == "m/story: hal_d=25.0% hal_i=25.0%"


def test_vigil_f1_is_a_percentage():
    from halsift.eval.metrics.vigil import multilabel_f1

    y = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 0]])
    p = np.array([[1, 0, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0]])  # objects: tp 1, fn 1 -> F1 2/3
    m = multilabel_f1(y, p)
    assert (m["f1/objects"], m["f1/background"], m["f1/object_omission"]) == (pytest.approx(200 / 3), 100.0, 0.0)
    assert m["f1/macro"] == pytest.approx((200 / 3 + 100) / 3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """metrics.json of a small run of every evaluation that writes percentages (retrieval: its own tests)."""
    from test_eval_bench import bench_df, make_bench, noisy, random_scores

    d = tmp_path_factory.mktemp("evals")
    path = make_bench(d / "bench.jsonl", images=8, counts=True)
    df = bench_df(path)
    outs = []  # a localizing judge marking the ground-truth span of every incorrect sentence
    for sent, spans in zip(df["sentence"], df["spans"]):
        w = sent.split()
        for s, e in reversed(spans):
            w[s:e] = ["**[" + " ".join(w[s:e]) + "]**"]
        outs.append("```json\n" + json.dumps({"output": " ".join(w)}) + "\n```")
    judge = noisy(df, 3).assign(output=outs, parsed=np.arange(len(df)) % 10 != 0)  # 10% unparsed
    evaluate_bench(path, {"judge": judge, "rnd": random_scores(df)}, d / "bench", ensembles=["judge+rnd"],
                   n_boot=20, plots=False)
    for argv in (["ihalla", "--synthetic", "--prompts", "6"], ["vope", "--synthetic", "--images", "4"],
                 ["vigil", "--synthetic", "--per-category", "2"]):
        assert main(["eval", *argv, "--out", str(d / argv[0])]) == 0
    return {name: json.loads((d / name / "metrics.json").read_text())
            for name in ("bench", "ihalla", "vope", "vigil")}


def test_no_share_is_left_in_a_metrics_json(runs):
    """Each file is marked ``scale: 100``; each key is a percentage, percentage points or a named non-percentage;
    the percentages of a kind lie in [0, 100] and are not all in [0, 1] with one above 0 (shares would be)."""
    seen: dict[str, list[float]] = {kind: [] for kind in PERCENT}
    for name, metrics in runs.items():
        assert metrics["scale"] == 100, name
        for key, value in metrics.items():
            kinds = [kind for kind, pats in PERCENT.items() if matches(key, pats)]
            other = matches(key, POINTS) + matches(key, NOT_PERCENT)
            assert len(kinds) + other == 1, f"{name}: {key} is {kinds or 'unclassified'}"
            if kinds and value is not None:
                assert 0 <= value <= 100, f"{name}: {key} = {value}"
                seen[kinds[0]].append(value)
            elif matches(key, POINTS):
                assert -100 <= value <= 100, f"{name}: {key} = {value}"
    for kind, values in seen.items():
        assert values, f"no {kind} key in any metrics.json"
        assert max(values) > 1 or max(values) == 0, f"{kind}: every value in (0, 1]: shares? {values[:5]}"


def test_an_earlier_halsifts_bench_metrics_read_as_percentages(tmp_path):
    old = {"auroc/mean": 71.5, "judge/precision@0.2/cap_a": 0.8, "judge/base_rate/cap_a": 0.625,
           "failure_rate/judge": 0.25, "bench/incorrect_rate/0": 0.375, "agreement/p_bar": 0.5,
           "agreement/kappa": 0.25, "judge/type_score/Color": 0.5, "judge/n_scored": 10}
    (tmp_path / "metrics.json").write_text(json.dumps(old))
    got = read_bench_metrics(tmp_path / "metrics.json")
    assert got == {"auroc/mean": 71.5, "judge/precision@0.2/cap_a": 80.0, "judge/base_rate/cap_a": 62.5,
                   "failure_rate/judge": 25.0, "bench/incorrect_rate/0": 37.5, "agreement/p_bar": 50.0,
                   "agreement/kappa": 0.25, "judge/type_score/Color": 0.5, "judge/n_scored": 10, "scale": 100}
    (tmp_path / "metrics.json").write_text(json.dumps(got))
    assert read_bench_metrics(tmp_path / "metrics.json") == got  # marked: read as it is
    (tmp_path / "metrics.json").write_text(json.dumps({**old, "scale": 10}))
    with pytest.raises(ValueError, match=r"metrics.json: scale 10: expected 100 \(percentages\) or none"):
        read_bench_metrics(tmp_path / "metrics.json")


def test_the_compare_report_flags_an_extra_eval_of_an_earlier_halsift(runs, tmp_path):
    from halsift.eval.report.compare import compare_filters_report

    evals = {}
    for name, scale in (("vope", 100), ("vigil", None)):
        folder = tmp_path / "eval" / name
        folder.mkdir(parents=True)
        (folder / "report.md").write_text(f"# {name.upper()} report\n\nrates\n")
        marked = {"m/story/hal_d": 25.0, "scale": scale} if scale else {"m/story/hal_d": 0.25}
        (folder / "metrics.json").write_text(json.dumps(marked))
        evals[name] = folder / "report.md"
    retrieval = {"no-tune": [{"s/i2t/r@5": 40.0, "s/t2i/r@5": 42.0}]}
    compare_filters_report("t", retrieval, {}, {}, ["s"], tmp_path / "report", wandb_mode="disabled",
                           extra_reports=evals, html=False)
    text = (tmp_path / "report" / "report.md").read_text()
    vope, vigil = text.split("# VOPE report\n")[1].split("# VIGIL report\n")
    assert vope.startswith("\nrates\n")  # marked: as it was written
    assert vigil.startswith(f"\n> Written by an earlier halsift (`{tmp_path / 'eval' / 'vigil' / 'metrics.json'}` "
                            "has no `scale: 100`): its rates and F1 are shares (0–1), not percentages; rerun the "
                            "evaluation for percentages.\n\nrates\n")
