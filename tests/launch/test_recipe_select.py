"""A recipe's select section reaches select(): keep, top_k and threshold, per variant too (tiny world, no model)."""

from __future__ import annotations

import json

from halsift.launch.cli import main

RECIPE = """
name: select-only
stages: [world, score, select]
world: {images: 60, bench_images: 12, pretrain_images: 12, retrieval_images: 20}
score:
  detectors: {random: "random:seed=0", oracle: oracle}
select:
  keep: 0.2
  unit: caption
  agg: prune
  variants:
    o-top: {filter: oracle, top_k: 5}
    r-thr: {filter: random, threshold: 50}
wandb: {mode: disabled}
"""


def _filter(run, name):
    return json.loads((run / "select" / name / "manifest.json").read_text())


def test_top_k_and_threshold_from_the_recipe(tmp_path, capsys):
    run, recipe = tmp_path / "run", tmp_path / "select.yaml"
    recipe.write_text(RECIPE)
    assert main(["run", str(recipe), f"run_dir={run}"]) == 0
    top, thr, plain = _filter(run, "o-top"), _filter(run, "r-thr"), _filter(run, "oracle")
    assert (top["filter"]["top_k"], top["filter"]["keep"], top["kept_units"]) == (5, None, 5)
    assert (thr["filter"]["threshold"], thr["filter"]["keep"]) == (50.0, None) and thr["kept_units"] > 0
    assert (plain["filter"]["keep"], plain["filter"]["top_k"], plain["filter"]["threshold"]) == (0.2, None, None)
    capsys.readouterr()
    # a changed threshold re-runs the selection (not reused from the folder) and keeps fewer units
    assert main(["run", str(recipe), f"run_dir={run}", "select.variants.r-thr.threshold=90"]) == 0
    assert "select: select changed since it ran" in capsys.readouterr().out
    again = _filter(run, "r-thr")
    assert again["filter"]["threshold"] == 90.0 and again["kept_units"] < thr["kept_units"]
