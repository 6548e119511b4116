"""The recipe's eval section is `halsift eval bench`'s settings (issue 40): same names, defaults, help and check,
minus what the recipe sets itself, and the eval stage hands them to the bench evaluation."""

import dataclasses

import pytest

from halsift.eval.runs.bench import BenchEvalConfig
from halsift.launch.recipe_config import EVAL_SET, EvalCfg

RECIPE_OWN = {"bench_split", "batch_size", "zeroshot", "compositional"}  # the eval stage's own settings


def test_every_bench_setting_the_recipe_does_not_set_is_in_the_section_with_its_default():
    command = {f.name: f for f in dataclasses.fields(BenchEvalConfig)}
    section = {f.name: f for f in dataclasses.fields(EvalCfg)}
    assert set(section) - RECIPE_OWN == set(command) - set(EVAL_SET)
    for name in set(section) - RECIPE_OWN:
        assert section[name].default == command[name].default, name
        assert section[name].metadata["help"] == command[name].metadata["help"], name


def test_the_same_check_refuses_a_bad_value():
    from halsift.corpus.config import from_dict

    with pytest.raises(ValueError, match=r"^n_boot: expected a value in \[10, inf\), got 5"):  # its declared range
        from_dict(EvalCfg, {"n_boot": 5})
    with pytest.raises(ValueError, match=r"^self_preference: 'judge' is not DETECTOR=GENERATOR"):
        EvalCfg(self_preference=["judge"]).validate()


def test_the_eval_stage_passes_the_section_to_the_bench_evaluation(tmp_path, monkeypatch):
    from halsift.eval.runs import bench_eval
    from halsift.launch.cmd_run import load_recipe
    from halsift.launch.stages import eval as stage
    from halsift.launch.stages.base import resolve_paths

    seen = {}

    class Stop(Exception):
        pass

    def record(bench, scores, out_dir, **kw):
        seen.update(kw)
        raise Stop("reached")

    monkeypatch.setattr(bench_eval, "evaluate_bench", record)
    monkeypatch.setattr(stage, "scored_names", lambda r: [])
    monkeypatch.setattr(stage, "bench_subset", lambda *a: str(tmp_path / "bench.jsonl"))
    (tmp_path / "bench.jsonl").write_text("")
    r = load_recipe("quickstart", [f"run_dir={tmp_path}", "eval.n_boot=17", "eval.plots=false", "eval.keep=0.3",
                                   "eval.self_preference=[judge=share-sim]", "seed=5"])
    p = resolve_paths(r)
    p.bench = str(tmp_path / "bench.jsonl")
    with pytest.raises(Stop, match="^reached$"):
        stage.stage_eval(r, p)
    # through the registry's `eval bench` (run_bench), as the command: the recipe's section, no html report
    assert seen == {"keep": 0.3, "seed": 5, "self_pref_map": {"judge": "share-sim"}, "n_boot": 17, "plots": False,
                    "ensembles": [], "likelihood": None, "html": False}
