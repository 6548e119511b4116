"""Issue 44: a recipe names a cascade like any detector: fitted on the corpus, the bench and the calibration rows
scored through its frozen plan, and the guaranteed selection certified on the cascade's own scores (tiny world)."""

from __future__ import annotations

import json

from halsift.launch.cli import main

RECIPE = """
name: cascade-recipe
stages: [world, score, select]
world: {images: 60, bench_images: 12, pretrain_images: 12, retrieval_images: 20}
score:
  detectors:
    oracle: oracle
    cascade: "cascade:cheap=[ensemble:members=[oracle;random:seed=0],weights=[0.1,0.9]],judge=[oracle],budget=0.5"
select: {max_hallucination: 0.6}
wandb: {mode: disabled}
"""


def test_a_recipe_runs_a_cascade_and_its_calibration_through_the_frozen_plan(tmp_path):
    run, recipe = tmp_path / "run", tmp_path / "cascade.yaml"
    recipe.write_text(RECIPE)
    assert main(["run", str(recipe), f"run_dir={run}"]) == 0
    score = run / "score" / "cascade"
    corpus = json.loads((score / "corpus" / "_manifest.json").read_text())
    assert corpus["cascade"]["frozen_from"] is None and 0 < corpus["cascade"]["judge_share"] <= 50
    # without an eval stage the whole bench is the calibration set (launch/stages/select.py)
    m = json.loads((score / "bench" / "_manifest.json").read_text())
    assert m["cascade"]["frozen_from"] == str(score / "corpus") and m["detector"] == corpus["detector"]
    sel = json.loads((run / "select" / "cascade" / "manifest.json").read_text())
    assert sel["guarantee"]["calibration_units"] > 0 and sel["guarantee"]["bound"] <= 60


def test_a_cascade_aimed_at_another_cut_than_the_selection_is_refused(tmp_path, capsys):
    run, recipe = tmp_path / "run", tmp_path / "cascade.yaml"
    recipe.write_text(RECIPE.replace("select: {max_hallucination: 0.6}", "select: {unit: caption, agg: mean}"))
    assert main(["run", str(recipe), f"run_dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "score.detectors.cascade: the cascade is aimed at agg=sentence" in err[0] and \
        "give it agg=mean" in err[0], err
    assert not (run / "world").exists()  # refused when the recipe is checked, before any stage ran
    assert main(["run", str(recipe), f"run_dir={run}", "--dry-run"]) == 2
