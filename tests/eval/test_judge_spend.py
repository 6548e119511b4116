"""The compare report shows what each filter spent on the judge (issue 44): judge calls and judge % beside retrieval
and kept precision, read from the score manifests (a cascade's block; a judge detector judges every unit; a
detector without one, none), and ``judge_fraction.png``: ΔR@5 over random against the judge fraction."""

from __future__ import annotations

import json

import matplotlib.axes
import numpy as np
import pytest
from PIL import Image
from test_compare_report import SET, fake_eval, r5

from halsift.eval.metrics.retrieval import write_ranks
from halsift.eval.report.compare import compare_filters_report
from halsift.filtering.scoring.judge_spend import is_judge_spec, judge_spend
from halsift.launch.recipe_config import Recipe, SelectVariantCfg

UNITS = 1000
CLIP = "clip:arch=ViT-B-32,pretrained=openai"
VLM = "vlm:model=/models/judge,mode=yes"


def adapter(path, kind: str):
    """An adapter folder as ``halsift train detector`` describes it (only ``detector.yaml`` is read)."""
    path.mkdir(parents=True)
    base = CLIP if kind == "clip" else VLM
    (path / "detector.yaml").write_text(f"kind: {kind}\nbase: '{base}'\nadapter: true\n")
    return path


def score_folder(path, manifest: dict):
    path.mkdir(parents=True, exist_ok=True)
    (path / "_manifest.json").write_text(json.dumps({"status": "complete", **manifest}))
    return path


def cascade_manifest(calls: int, share: float) -> dict:
    return {"detector": f"cascade:cheap=[{CLIP}],judge=[{VLM}],budget=0.25", "sentences": UNITS,
            "cascade": {"units": UNITS, "judge_calls": calls, "judge_share": share, "sample_units": 75,
                        "band_units": calls - 75}}


def test_what_counts_as_a_judge(tmp_path):
    judge, clip_lora = adapter(tmp_path / "judge", "vlm"), adapter(tmp_path / "clip", "clip")
    for spec in (VLM, "api:model=gpt-4o", "vllm:model=/models/judge", f"lora:{judge}",
                 # the quickstart's world judge: a LoRA VLM z-scored with the captioner's image PMI
                 f"ensemble:members=[lora:{judge};vlm:model=/m,mode=pmi,references=/r,n_references=4],norm=zscore",
                 f"ensemble:members=[lora:{clip_lora};{VLM}]"):
        assert is_judge_spec(spec) is True, spec
    for spec in (CLIP, f"lora:{clip_lora}", "random:seed=0", "oracle", "student:path=/s,embeddings=/e",
                 f"ensemble:members=[{CLIP};random:seed=0]"):
        assert is_judge_spec(spec) is False, spec
    # cannot be told: an adapter folder without its description, an unknown family
    assert is_judge_spec(f"lora:{tmp_path / 'absent'}") is None
    assert is_judge_spec("bogus:x=1") is None


def test_judge_spend_of_score_folders(tmp_path):
    judge = score_folder(tmp_path / "judge", {"detector": VLM, "sentences": UNITS})
    clip = score_folder(tmp_path / "clip", {"detector": CLIP, "sentences": UNITS})
    cascade = score_folder(tmp_path / "cascade", cascade_manifest(251, 25.1))
    assert judge_spend(judge) == {"judge_calls": UNITS, "units": UNITS, "judge_fraction": 100.0}
    assert judge_spend(clip) == {"judge_calls": 0, "units": UNITS, "judge_fraction": 0.0}
    assert judge_spend(cascade) == {"judge_calls": 251, "units": UNITS, "judge_fraction": 25.1}
    # a recipe ensemble (mean of folders) spent what its members did
    ens = score_folder(tmp_path / "ens", {"detector": "judge+clip", "rows": UNITS, "members": [str(judge), str(clip)]})
    assert judge_spend(ens) == {"judge_calls": UNITS, "units": UNITS, "judge_fraction": 100.0}
    both = score_folder(tmp_path / "both", {"detector": "j+c", "rows": UNITS, "members": [str(judge), str(cascade)]})
    assert judge_spend(both)["judge_calls"] == UNITS + 251 and judge_spend(both)["judge_fraction"] == 125.1
    # unknown: no manifest, a detector that cannot be told, a member that cannot
    assert judge_spend(tmp_path / "absent") is None
    assert judge_spend(score_folder(tmp_path / "odd", {"detector": "bogus:x=1", "sentences": UNITS})) is None
    bad = score_folder(tmp_path / "bad", {"detector": "x", "rows": UNITS, "members": [str(tmp_path / "absent")]})
    assert judge_spend(bad) is None


RATES = {"no-tune": 0.30, "random": 0.50, "oracle": 0.90, "clip-lora": 0.52, "judge": 0.65, "cascade-25": 0.62,
         "cascade-25@0.1": 0.55}
SCORED = {"judge": {"detector": VLM, "sentences": UNITS},
          "clip-lora": {"detector": "lora:{clip_adapter}", "sentences": UNITS},
          "cascade-25": cascade_manifest(250, 25.0),
          "random": {"detector": "random:seed=0", "sentences": UNITS},
          "oracle": {"detector": "oracle", "sentences": UNITS}}
WANT = {"judge": (UNITS, 100.0), "clip-lora": (0, 0.0), "cascade-25": (250, 25.0), "cascade-25@0.1": (250, 25.0),
        "random": (0, 0.0), "oracle": (0, 0.0)}  # the variant reads cascade-25's scores


def run_report(tmp_path, monkeypatch):
    """A recipe run folder (retrieval, ranks, selections, score manifests) through the report stage; returns the
    metrics, the markdown, the run folder, the retrieval and what ``judge_fraction.png``'s errorbar drew."""
    from halsift.launch.stages import Paths
    from halsift.launch.stages.report import stage_report

    retrieval, ranks = fake_eval(RATES, n_img=400)
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "retrieval.json").write_text(json.dumps(retrieval))
    write_ranks(run / "eval" / "retrieval_ranks.npz", ranks)
    clip_adapter = adapter(tmp_path / "clip-adapter", "clip")
    for name, m in SCORED.items():
        m = {**m, "detector": m["detector"].format(clip_adapter=clip_adapter)}
        score_folder(run / "score" / name / "corpus", m)
    for name in WANT:
        (run / "select" / name).mkdir(parents=True)
        (run / "select" / name / "manifest.json").write_text(json.dumps({"precision": {"kept": 0.8}}))
    r = Recipe(name="t")
    r.wandb.mode, r.eval.bench_split = "disabled", ""
    r.score.detectors, r.score.ensembles = {n: "" for n in SCORED}, {}
    r.select.variants = {"cascade-25@0.1": SelectVariantCfg(filter="cascade-25", keep=0.1)}
    drawn = []
    errorbar = matplotlib.axes.Axes.errorbar

    def record(ax, x, y, *args, **kwargs):  # every errorbar plot of the report, told apart by its axis label
        drawn.append((ax, np.asarray(x), np.asarray(y), kwargs.get("yerr")))
        return errorbar(ax, x, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", record)
    monkeypatch.setattr("halsift.launch.stages.report.report_samples", lambda r, p: None)  # no corpus shards here
    metrics = stage_report(r, Paths(run, "", "", {SET: "unused"}, "", ""))["metrics"]
    return metrics, (run / "report" / "report.md").read_text(), run, retrieval, drawn


def test_report_shows_judge_calls_and_plots_gain_against_judge_fraction(tmp_path, monkeypatch):
    metrics, text, run, retrieval, drawn = run_report(tmp_path, monkeypatch)
    lines = text.splitlines()
    head = [c.strip() for c in next(line for line in lines if line.startswith("| Filter")).split("|")[1:-1]]
    # beside retrieval and kept precision
    assert head.index("kept precision") < head.index("judge calls") < head.index("judge %") < head.index("seeds")
    for name, (calls, frac) in WANT.items():
        cells = [c.strip() for c in next(line for line in lines if line.startswith(f"| {name} ")).split("|")[1:-1]]
        assert cells[head.index("judge calls")] == str(calls), name
        assert cells[head.index("judge %")] == f"{frac:.1f}", name
        assert metrics[f"{name}/judge_calls"] == calls and metrics[f"{name}/judge_fraction"] == frac
    no_tune = [c.strip() for c in next(line for line in lines if line.startswith("| no-tune ")).split("|")[1:-1]]
    assert no_tune[head.index("judge calls")] == "–" and "no-tune/judge_fraction" not in metrics
    assert "`judge_fraction.png`" in text and "Judge calls:" in text
    # the plot: one point per filter with a judge fraction, at (fraction, ΔR@5 over random), CIs as error bars
    png = run / "report" / "judge_fraction.png"
    Image.open(png).verify()
    plots = [d for d in drawn if d[0].get_xlabel().startswith("judge fraction")]
    assert len(plots) == 1
    ax, x, y, yerr = plots[0]
    names = [t.get_text() for t in ax.texts]
    assert sorted(names) == sorted(WANT)
    for name, xi, yi in zip(names, x, y):
        assert xi == WANT[name][1]
        assert yi == pytest.approx(r5(retrieval, name) - r5(retrieval, "random"))
    yerr = np.asarray(yerr)
    for i, name in enumerate(names):
        if name == "random":  # the reference itself: no interval
            assert yerr[:, i].tolist() == [0.0, 0.0]
            continue
        # 3 fine-tuning seeds each: the interval over seeds and queries, as the report's answer reads it
        lo, hi = metrics[f"{name}/delta_random/seeds_ci_low"], metrics[f"{name}/delta_random/seeds_ci_high"]
        assert lo < metrics[f"{name}/delta_random/ci_low"] and metrics[f"{name}/delta_random/ci_high"] < hi
        assert lo < y[i] < hi
        assert yerr[:, i] == pytest.approx([y[i] - lo, hi - y[i]])
    assert "judge fraction" in (run / "report" / "index.html").read_text()


def test_without_judge_spend_no_columns_and_no_stale_plot(tmp_path):
    retrieval, _ = fake_eval({"no-tune": 0.3, "random": 0.5, "judge": 0.6}, n_img=200)
    sel = {n: {"precision": {"kept": 0.8}} for n in ("random", "judge")}
    (tmp_path / "judge_fraction.png").write_bytes(b"stale")
    compare_filters_report("t", retrieval, {}, sel, [SET], tmp_path, wandb_mode="disabled", filters=["judge", "random"],
                           html=False, judge={"random": {"judge_calls": 0, "judge_fraction": 0.0},
                                              "judge": {"judge_calls": 40, "judge_fraction": 100.0}})
    assert "| judge calls | judge % |" in (tmp_path / "report.md").read_text()
    Image.open(tmp_path / "judge_fraction.png").verify()  # without ranks: drawn, without error bars
    compare_filters_report("t", retrieval, {}, sel, [SET], tmp_path, wandb_mode="disabled", filters=["judge", "random"],
                           html=False)
    text = (tmp_path / "report.md").read_text()
    assert "judge calls" not in text and "judge_fraction.png" not in text
    assert not (tmp_path / "judge_fraction.png").exists()


def test_a_distilled_student_carries_its_teachers_calls(tmp_path):
    """A student calls no judge when it scores, but its teacher (a judge's score folder, named in the student's
    config.json) was paid for: the calls count with the student, alone and as a cascade's cheap stage."""
    teacher = score_folder(tmp_path / "teacher", {"detector": VLM, "sentences": 100})
    student = tmp_path / "student"
    student.mkdir()
    (student / "config.json").write_text(json.dumps({"teacher": str(teacher)}))
    spec = f"student:path={student}"
    alone = score_folder(tmp_path / "alone", {"detector": spec, "sentences": UNITS})
    assert judge_spend(alone) == {"judge_calls": 100, "units": UNITS, "judge_fraction": 10.0}
    cascade = score_folder(tmp_path / "cascade", {**cascade_manifest(151, 15.1),
                                                  "detector": f"cascade:cheap=[{spec}],judge=[{VLM}],budget=0.15"})
    assert judge_spend(cascade) == {"judge_calls": 251, "units": UNITS, "judge_fraction": 25.1}
    (student / "config.json").write_text("{}")  # its record no longer says what taught it: cannot be told
    assert judge_spend(alone) is None
