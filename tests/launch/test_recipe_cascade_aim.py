"""Issue 51, rule 3 (cause 8): a recipe's cascade must aim at its selection's cut. Every selection the recipe makes
from a cascade's scores (select's own, each select.variants entry of that detector) keeps the share the cascade
judges around (its keep) of the units it judges (its agg), or the recipe is refused when it is checked
(``--dry-run`` included), before any stage runs. A guaranteed selection certifies its own cut (not checked); a
top_k or threshold selection is a cut a cascade cannot aim at (refused)."""

from __future__ import annotations

import pytest

from halsift.launch.cli import main

CASCADE = "cascade:cheap=[ensemble:members=[oracle;random:seed=0],weights=[0.1,0.9]],judge=[oracle],budget=0.5"
RECIPE = f"""
name: aim
stages: [world, score, select]
world: {{images: 60, bench_images: 12, pretrain_images: 12, retrieval_images: 20}}
score:
  detectors:
    oracle: oracle
    cas: "{CASCADE}"
select: {{}}
wandb: {{mode: disabled}}
"""


def _run(tmp_path, capsys, *overrides, dry=True):
    recipe = tmp_path / "aim.yaml"
    recipe.write_text(RECIPE)
    rc = main(["run", str(recipe), f"run_dir={tmp_path / 'run'}", *(["--dry-run"] if dry else []), *overrides])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert "Traceback" not in captured.err and len(err) <= 1, captured.err
    return rc, err[0] if err else ""


@pytest.mark.parametrize("overrides, message", [
    (["select.keep=0.6"], "score.detectors.cas: the cascade judges around keep=0.2, but select keeps 0.6 of the "
                          "units: give it keep=0.6"),  # the probe's case
    ([f"score.detectors.cas={CASCADE},keep=0.3", "select.keep=0.2"], "judges around keep=0.3, but select keeps 0.2"),
    (["select.top_k=10"], "score.detectors.cas: the cascade judges around a kept share (keep=0.2), but select.top_k "
                          "keeps a count or a score: give select.keep=0.2 instead"),
    (["select.threshold=50"], "but select.threshold keeps a count or a score"),
    (["select.variants.half={filter: cas, keep: 0.5}"],
     "select.variants.half: the cascade judges around keep=0.2, but select.variants.half keeps, from "
     "score.detectors.cas, 0.5 of the units: a cascade aims at one cut"),
    (["select.variants.whole={filter: cas, unit: caption, agg: mean}"],
     "select.variants.whole: the cascade is aimed at agg=sentence, but select.variants.whole keeps, from "
     "score.detectors.cas, whole captions by their mean sentence score"),
    (["select.unit=caption", "select.agg=min"], "the cascade is aimed at agg=sentence, but select keeps whole captions "
                                                "by their min sentence score"),
])
def test_a_cascade_aimed_at_another_cut_is_refused_by_the_dry_run(tmp_path, capsys, overrides, message):
    rc, line = _run(tmp_path, capsys, *overrides)
    assert rc == 2 and message in line, line


@pytest.mark.parametrize("overrides", [
    [],  # select's default keep (0.2) is the cascade's default keep
    [f"score.detectors.cas={CASCADE},keep=0.6", "select.keep=0.6"],
    ["select.variants.other={filter: oracle, keep: 0.5}"],  # another detector's selection
    ["select.variants.pruned={filter: cas, unit: caption, agg: prune}"],  # pruning keeps sentences: the same cut
    ["select.max_hallucination=0.5"],  # the guarantee certifies its own cut
    ["score.unit=caption", "select.unit=caption", "select.agg=mean"],  # the scored units are whole captions
    [f"score.detectors.cas={CASCADE},agg=mean", "select.unit=caption", "select.agg=mean",
     "select.variants.c2={filter: cas, unit: caption, agg: mean}"],
])
def test_a_cascade_aimed_at_every_cut_it_serves_passes(tmp_path, capsys, overrides):
    rc, line = _run(tmp_path, capsys, *overrides)
    assert rc == 0, line


def test_the_refusal_comes_before_any_stage_runs(tmp_path, capsys):
    rc, line = _run(tmp_path, capsys, "select.keep=0.6", dry=False)
    assert rc == 2 and "give it keep=0.6" in line
    assert not (tmp_path / "run" / "world").exists()
