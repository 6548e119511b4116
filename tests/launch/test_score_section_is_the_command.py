"""The recipe's score section is `halsift score`'s settings: every setting a recipe does not set itself is there,
under the same name, and reaches the score run as the command's flag does (through the same ScoreJob and Engine)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from filtering_data import make_corpus

from halsift.filtering.scoring.config import ScoreConfig
from halsift.launch.cli import main
from halsift.launch.cmd_run import load_recipe
from halsift.launch.recipe_config import SCORE_SET
from halsift.launch.stages.base import Paths
from halsift.launch.stages.score import stage_score

TINY = "clip:arch=halsift-tiny,pretrained=random,seed=0"


def test_every_score_setting_the_recipe_does_not_set_is_under_score_in_describe(capsys):
    with pytest.raises(SystemExit, match="0") as done:
        main(["run", "quickstart", "--describe"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    section = re.search(r"(?ms)^score:.*?\n(.*?)^\S", text).group(1)
    described = set(re.findall(r"(?m)^  (\w+):", section))
    wanted = {f.name for f in dataclasses.fields(ScoreConfig)} - set(SCORE_SET)
    assert wanted and wanted <= described, sorted(wanted - described)
    assert {"decode_workers", "device", "engine", "embeddings", "batch_size", "full_hash"} <= wanted
    assert not set(SCORE_SET) & described  # what the recipe sets itself is not offered twice


def test_a_recipe_records_decode_workers_in_its_score_manifest_as_the_command_does(tmp_path):
    corpus = make_corpus(tmp_path / "c", shards=2, per_shard=3, seed=1)
    assert main(["score", "--detector", TINY, "--data", str(corpus), "--out", str(tmp_path / "cli"), "--no-progress",
                 "--decode-workers", "1"]) == 0
    cli = json.loads((tmp_path / "cli" / "_manifest.json").read_text())
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""name: t
run_dir: {tmp_path / 'run'}
world: {{enabled: false}}
model: {{arch: halsift-tiny, pretrained: random}}
data: {{corpus: {corpus}, retrieval: {{r: {corpus}}}}}
stages: [score, select]
score: {{detectors: {{tiny: '{TINY}'}}, decode_workers: 1, no_progress: true}}
wandb: {{mode: disabled}}
""")
    r = load_recipe(str(recipe), [])
    p = Paths(tmp_path / "run", str(corpus), "", {}, "", "", str(corpus))
    stage_score(r, p)
    got = json.loads((tmp_path / "run" / "score" / "tiny" / "corpus" / "_manifest.json").read_text())
    assert got["status"] == "complete" and got["run_settings"]["decode_workers"] == 1
    assert (got["decode_workers"], got["run_settings"]) == (cli["decode_workers"], cli["run_settings"])
    assert got["decode_workers"] == 1  # the clip detector reads through its decode worker, as under the command


def test_settings_that_change_only_how_scoring_runs_never_rescore(tmp_path):
    from halsift.launch.recipe import stage_fingerprints

    def score_fp(*over):
        return stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path}", *over]))["score"]["fingerprint"]

    base = score_fp()
    assert score_fp("score.decode_workers=3", "score.device=cpu", "score.engine=ray", "score.workers=2",
                    "score.address=auto", "score.full_hash=true", "score.no_progress=true", "score.batch_size=8",
                    "score.max_parse_failures=0.5") == base  # run-only: the one list, as for halsift score
    assert score_fp("score.embeddings=emb") != base  # stored vectors: another rounding of what is scored
    assert score_fp("score.unit=caption") != base
