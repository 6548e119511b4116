"""Every shipped recipe parses and dry-runs (found recursively); recipe errors name the key."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from halsift.launch.cli import main
from halsift.launch.cmd_run import load_recipe, shipped_recipes
from halsift.corpus.config import ConfigError
from halsift.launch.recipe import check
from halsift.launch.stages.detectors import trained_configs
from halsift.launch.stages.score import detector_specs

RECIPES = shipped_recipes()
REPO_RECIPES = sorted((Path(__file__).parents[2] / "recipes").rglob("*.yaml"))


def test_every_recipe_file_in_the_repo_is_shipped():
    assert len(REPO_RECIPES) >= 4
    assert {p.name for p in REPO_RECIPES} == {p.name for p in RECIPES.values()}


def _user_data_overrides(recipe, tmp_path: Path) -> list[str]:
    """Real-scale recipes point at user data: stand in empty files at the same kind of paths."""
    over = []
    if not recipe.world.enabled:
        shards = tmp_path / "shards"
        shards.mkdir(exist_ok=True)
        (shards / "000000.tar").write_bytes(b"")
        bench = tmp_path / "bench.jsonl"
        bench.write_text("")
        over.append(f"data.bench={bench}")
        if recipe.data.corpus:
            over.append(f"data.corpus={shards}/{{000000..000000}}.tar")
        for name in recipe.data.retrieval:
            f = tmp_path / f"{name}.jsonl"
            f.write_text("")
            over.append(f"data.retrieval.{name}={f}")
    return over


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_shipped_recipe_parses_and_dry_runs(name, tmp_path, capsys):
    recipe = load_recipe(name, [])
    over = _user_data_overrides(recipe, tmp_path) + [f"run_dir={tmp_path / 'run'}"]
    assert main(["run", name, *over, "--dry-run"]) == 0, capsys.readouterr().err
    recipe = load_recipe(name, over)
    specs = detector_specs(recipe, check(recipe))
    assert specs and all("{" not in s for s in specs.values())  # placeholders resolved
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_quickstart_yaml_opens_with_its_command():
    first = RECIPES["quickstart"].read_text().splitlines()[0]
    assert first.startswith("# halsift run quickstart")


@pytest.mark.parametrize("override, key", [
    ("select.keep=1.5", "select.keep"), ("finetune.stepz=3", "finetune.stepz"), ("stages=[world, fly]", "stages"),
    ("score.detectors.x=nope:a=1", "score.detectors.x"), ("score.ensembles.e=[clip, ghost]", "score.ensembles.e"),
    ("world.enabled=false", "data.corpus"), ("score.detectors.clip=clip:arch={archh}", "score.detectors.clip"),
    ('score.detectors.x="{trained.ghost}"', "score.detectors.x"), ("detectors.judge.kind=lorax", "detectors.judge.kind"),
    ("detectors.clip-lora.options={stepz: 3}", "detectors.clip-lora.options.stepz"),
    ("detectors.clip-lora.options={steps: 0}", "detectors.clip-lora.options.steps"),
    ("detectors.judge.options={judge_steps: many}", "detectors.judge.options.judge_steps"),
    ("detectors.clip-lora.options={out: /tmp/x}", "detectors.clip-lora.options.out"),
    ("stages=[world, pretrain, score, select, finetune, eval, report]", "stages"),
    ("select.variants={o@0.1: {filter: ghost}}", "select.variants.o@0.1.filter"),
    ("select.variants={clip: {filter: oracle}}", "select.variants.clip"),
    ("select.variants={o@2: {filter: oracle, keep: 2}}", "select.variants.o@2.keep"),
    ("select.variants={o: {filter: oracle, agg: median}}", "select.variants.o.agg"),
    ("world.captioners=[gpt-sim, bard-sim]", "world.captioners"),
    ("world.retrieval_style=cartoon", "world.retrieval_style"),
    ("select.variants={clip/whole: {filter: clip, agg: mean}}", "select.variants.clip/whole"),
    ("score.detectors.clip=clip:arch={arch},chekpoint={base}", "unknown option 'chekpoint'"),
    ("score.detectors.e=ensemble:members=[random:seed=1;vlm:model=m,mod=pmi]", "unknown option 'mod'"),
    ("score.detectors.c=clip:arch={arch},checkpoint=/nowhere/clip.safetensors", "checkpoint=/nowhere"),
    ("score.detectors.l=lora:/nowhere/adapter", "path=/nowhere/adapter"),
    ("score.detectors.c=clip:arch={arch},center=high", "center: expected a number, got 'high'"),
    ("score.detectors.e=ensemble:members=[random:seed=1;vlm:mode=pmi]", "missing option 'model' for family 'vlm'"),
    ("evals.ihalla.promts=3", "evals.ihalla.promts"), ("evals.ihalla.prompts=0", "evals.ihalla.prompts"),
    ("evals.vope.out=/tmp/x", "evals.vope.out"), ("evals.vigil.encoder=sam", "evals.vigil.encoder"),
    ("evals.vigil={synthetic: true, annotations: a.json}", "evals.vigil.synthetic"),
    ("evals.vope={responses: r.jsonl, unparsed: maybe}", "evals.vope.unparsed"),
    ("evals.pope={synthetic: true}", "evals.pope"), ("evals.ihalla=[--synthetic]", "evals.ihalla"),
    ("select.top_k=-1", "select.top_k"), ("select.threshold=101", "select.threshold"),
    ("select.variants={o: {filter: oracle, top_k: 5, threshold: 50}}", "select.variants.o.threshold"),
    ("finetune.precision=fp64", "finetune.precision"), ("pretrain.grad_accum=0", "pretrain.grad_accum"),
    ("finetune.workers=2.5", "finetune.workers: expected an integer"), ("pretrain.augment=1", "pretrain.augment"),
])
def test_bad_recipe_fails_fast_naming_the_key(override, key, capsys):
    start = time.perf_counter()
    assert main(["run", "quickstart", override, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert key in err and err.count("\n") == 1, err
    assert time.perf_counter() - start < 30  # generous: the budget (2 s) is checked by hand, not here


def test_dry_run_loads_no_heavy_library():
    """The dry run validates names from data and source (open_clip's config files, detector signatures read from
    their modules), so it answers without importing torch, open_clip or transformers."""
    import subprocess
    import sys

    code = ("import sys; from halsift.launch.cli import main; rc = main(['run', 'quickstart', '--dry-run']); "
            "print(rc, sorted(m for m in ('torch', 'open_clip', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 []", out


def test_missing_user_path_is_named(tmp_path):
    with pytest.raises(ConfigError, match="data.bench"):
        check(load_recipe("paper/alignbench_detectors", [f"data.bench={tmp_path / 'absent.jsonl'}"]))


def test_describe_and_list(capsys):
    with pytest.raises(SystemExit, match="^0$") as e:  # like --help
        main(["run", "--describe"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "keep: 0.2" in out and "# fraction of units to keep" in out
    assert "dry_run: false  # resolve and check the recipe" in out  # the command's own flags too
    assert main(["run", "--list"]) == 0
    assert "quickstart" in capsys.readouterr().out


def test_trained_detectors_resolve_to_their_adapters(tmp_path):
    """``{trained.NAME}`` is the spec the detectors stage will write: ``lora:<run_dir>/detectors/NAME/...``."""
    recipe = load_recipe("quickstart", [f"run_dir={tmp_path}"])
    specs = detector_specs(recipe, check(recipe))
    assert specs["clip-lora"] == f"lora:{tmp_path / 'detectors' / 'clip-lora' / 'adapter'}"
    judge = tmp_path / "detectors" / "judge"
    assert specs["judge"] == (f"ensemble:members=[lora:{judge / 'judge' / 'adapter'};vlm:model={judge / 'pretrained'},"
                              f"mode=pmi,references={judge / 'references'},n_references=4],norm=zscore")
    assert recipe.world.pretrain_images == 6000
    vision = trained_configs(recipe, check(recipe))["judge"]
    assert vision.vision_from == str(tmp_path / "pretrain" / "final" / "open_clip_model.safetensors")
    assert vision.vision_arch == "halsift-tiny"
    with pytest.raises(ConfigError, match="detectors.judge: kind world_judge needs the synthetic world"):
        load_recipe("quickstart", ["world.enabled=false", "data.corpus=x", "data.retrieval.a=y", "data.bench=z",
                                   "model.pretrained=openai"])


def test_stage_fingerprints_change_from_the_edited_stage_on(tmp_path):
    from halsift.launch.recipe import stage_fingerprints

    base = stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path}"]))
    assert base == stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path / 'elsewhere'}"]))
    lr = stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path}", "finetune.lr=0.0003"]))
    order = list(base)
    assert order == ["world", "pretrain", "detectors", "dedup", "score", "select", "finetune", "eval", "report"]
    for stage in order:
        assert (lr[stage]["fingerprint"] == base[stage]["fingerprint"]) == (order.index(stage) < order.index("finetune"))
    assert lr["finetune"]["sections"] != base["finetune"]["sections"] and lr["eval"]["sections"] == base["eval"]["sections"]
    seed = stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path}", "seed=1"]))
    assert all(seed[s]["fingerprint"] != base[s]["fingerprint"] for s in order)


def test_a_recipe_on_several_ranks_needs_a_launch_id(tmp_path, monkeypatch, capsys):
    """Under torchrun without `halsift launch` (no HALSIFT_LAUNCH_ID, no rendezvous id) the ranks could not tell this
    launch's stage records from an earlier one's: refused in one line (tests/launch/test_recipe_ranks.py runs it)."""
    for k in ("HALSIFT_LAUNCH_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["run", "quickstart", f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "no launch id" in err and "HALSIFT_LAUNCH_ID" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_recipe_evals_call_the_library_with_typed_sections(tmp_path, monkeypatch):
    """The eval stage runs each `evals:` section through the eval's library function (never the CLI), into
    <run_dir>/eval/NAME, with the same numbers as `halsift eval NAME` given the same settings as flags."""
    import json

    import halsift.launch.cli as cli
    from halsift.launch.cmd_run import load_recipe
    from halsift.launch.stages.eval import run_extra_evals

    r = load_recipe("paper/seed_evals", [f"run_dir={tmp_path / 'run'}", "evals.ihalla.prompts=4",
                                         "evals.vope.images=3", "evals.vigil.per_category=3"])
    assert r.evals.ihalla.synthetic and r.evals.ihalla.prompts == 4 and r.evals.vigil.per_category == 3
    flags = {"ihalla": ["--synthetic", "--prompts", "4"], "vope": ["--synthetic", "--images", "3"],
             "vigil": ["--synthetic", "--per-category", "3"]}
    for name, f in flags.items():  # the command first, before main is taken away
        assert main(["eval", name, *f, "--out", str(tmp_path / "cli" / name)]) == 0

    def no_cli(argv=None):
        raise AssertionError(f"the recipe called the CLI: {argv}")

    monkeypatch.setattr(cli, "main", no_cli)
    done = run_extra_evals(r, tmp_path / "run" / "eval")
    assert sorted(done) == ["ihalla", "vigil", "vope"]
    for name in flags:
        got = (tmp_path / "run" / "eval" / name / "metrics.json").read_text()
        assert got == (tmp_path / "cli" / name / "metrics.json").read_text(), name
        assert json.loads(got) and (tmp_path / "run" / "eval" / name / "report.md").exists()


def test_train_sections_are_train_clip_configs(tmp_path, monkeypatch):
    """One schema: a recipe's pretrain/finetune sections hold `train clip`'s fields, defaults and help, and every
    one of them reaches the ClipTrainConfig the stage trains with."""
    import dataclasses

    from halsift.launch.stages import shared
    from halsift.launch.recipe_config import RECIPE_SET, FinetuneCfg
    from halsift.training.clip_config import ClipTrainConfig

    ours = {f.name: f for f in dataclasses.fields(FinetuneCfg)}
    for f in dataclasses.fields(ClipTrainConfig):
        assert (f.name in ours) != (f.name in RECIPE_SET), f.name
        if f.name in ours:
            assert ours[f.name].default == f.default and ours[f.name].metadata["help"] == f.metadata["help"]
    r = load_recipe("quickstart", [f"run_dir={tmp_path}", "finetune.grad_accum=2", "finetune.precision=fp32",
                                   "pretrain.lock_image=true"])
    monkeypatch.setattr(shared, "bench_subset", lambda bench, split, out: f"{bench}@{split}")
    fine = shared.train_cfg(r, r.finetune, ["sel"], tmp_path / "f" / "seed0", "base.safetensors", 3)
    pre = shared.train_cfg(r, r.pretrain, ["pre"], tmp_path / "p", "", 0)
    assert (fine.grad_accum, fine.precision, fine.lr, fine.steps, fine.workers, fine.seed) == (2, "fp32", 1e-3, 300, 0, 3)
    assert (pre.lock_image, pre.steps, pre.warmup, pre.model, pre.pretrained) == (True, 800, 40, "halsift-tiny", "")
    assert fine.bench.endswith("@test") and fine.resume and fine.wandb_run == "quickstart-f-seed0"


def test_select_top_k_and_threshold_reach_select():
    r = load_recipe("quickstart", ["select.top_k=100", "select.variants={o@50: {filter: oracle, threshold: 50}, "
                                   "o@0.1: {filter: oracle, keep: 0.1}, o-sent: {filter: oracle, unit: sentence}}"])
    assert r.select.resolved("clip") == ("clip", {"keep": None, "top_k": 100, "threshold": None, "unit": "caption",
                                                   "agg": "mean"})
    assert r.select.resolved("o@50")[1] == {"keep": None, "top_k": None, "threshold": 50.0, "unit": "caption",
                                            "agg": "mean"}
    assert r.select.resolved("o@0.1")[1]["keep"] == 0.1 and r.select.resolved("o@0.1")[1]["top_k"] is None
    assert r.select.resolved("o-sent") == ("oracle", {"keep": None, "top_k": 100, "threshold": None,
                                                      "unit": "sentence", "agg": "mean"})
    plain = load_recipe("quickstart", [])
    assert plain.select.resolved("clip")[1] == {"keep": 0.2, "top_k": None, "threshold": None, "unit": "caption",
                                               "agg": "mean"}
