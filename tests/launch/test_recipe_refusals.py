"""Recipes and selection settings refused in one line, exit 2 (issue 41): an empty or null recipe (also in
--dry-run), recursive YAML aliases (naming file and key), --max-hallucination beside --keep."""

from __future__ import annotations

import pytest
import yaml

from halsift.corpus.config import ConfigError, load_yaml
from halsift.corpus.safe_yaml import safe_load_yaml
from halsift.launch.cli import main


def _err(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err, err
    return err[0]


@pytest.mark.parametrize("text", ["", "null\n", "~\n", "# only a comment\n", "---\n", "   \n\n"])
@pytest.mark.parametrize("dry", [True, False])
def test_an_empty_or_null_recipe_is_refused(tmp_path, capsys, monkeypatch, text, dry):
    import halsift.launch.recipe as recipe

    def must_not_run(*a, **k):
        raise AssertionError("an empty recipe reached run_recipe")

    monkeypatch.setattr(recipe, "run_recipe", must_not_run)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(text)
    assert main(["run", str(tmp_path / "r.yaml"), *(["--dry-run"] if dry else [])]) == 2
    err = _err(capsys)
    assert "r.yaml" in err and "empty" in err
    assert not (tmp_path / "runs").exists()


def test_an_empty_recipe_with_overrides_is_still_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text("")
    assert main(["run", str(tmp_path / "r.yaml"), "--dry-run", "run_dir=x"]) == 2
    assert "empty" in _err(capsys)


def test_an_empty_command_config_is_still_allowed(tmp_path):
    (tmp_path / "c.yaml").write_text("")
    assert load_yaml(tmp_path / "c.yaml") == {}
    with pytest.raises(ConfigError, match="c.yaml: the file is empty"):
        load_yaml(tmp_path / "c.yaml", empty_ok=False)


@pytest.mark.parametrize("text,key", [
    ("score:\n  detectors: &x\n    a: *x\n", "score.detectors.a"),
    ("a: &x [*x]\n", "a[0]"),
    ("world:\n  enabled: true\nselect: &s\n  keep: [1, 2, {deep: *s}]\n", "select.keep[2].deep"),
    ("&top\nx: *top\n", "x"),
])
def test_recursive_aliases_name_the_file_and_the_key(tmp_path, capsys, monkeypatch, text, key):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop.yaml").write_text(text)
    assert main(["run", str(tmp_path / "loop.yaml"), "--dry-run"]) == 2
    err = _err(capsys)
    assert "loop.yaml" in err and f"the key {key} " in err and "recursive alias" in err


def test_shared_aliases_that_do_not_recurse_still_load():
    text = "a: &x {b: 1}\nc: *x\nd: [*x, *x]\n"
    assert safe_load_yaml(text) == {"a": {"b": 1}, "c": {"b": 1}, "d": [{"b": 1}, {"b": 1}]}
    # a wide DAG of aliases is walked once per node, not once per path (9 levels of 9 aliases)
    lines = ["l0: &l0 [1]"] + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 4)]
    assert len(safe_load_yaml("\n".join(lines))["l3"]) == 9
    with pytest.raises(yaml.YAMLError, match="recursive alias"):
        safe_load_yaml("a: &x\n  b: [1, *x]\n")


@pytest.mark.parametrize("amount", [["--keep", "0.3"], ["--top-k", "5"], ["--threshold", "50"]])
def test_max_hallucination_refuses_every_other_amount(tmp_path, capsys, amount):
    with pytest.raises(SystemExit, match="^2$"):  # argparse: the amounts are one exclusive group
        main(["select", "--scores", str(tmp_path / "s"), "--data", str(tmp_path / "d"), "--out",
              str(tmp_path / "o"), "--calibration", str(tmp_path / "c"), "--max-hallucination", "0.1", *amount])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--max-hallucination" in err and amount[0] in err
    assert not (tmp_path / "o").exists()


# keep beside max_hallucination: one rule in the selection settings (check_guarantee), wherever they come from
@pytest.mark.parametrize("given", [{"keep": 0.3}, {"keep": 0.2}, {"keep": 1.0}, {"top_k": 5}, {"threshold": 50}])
def test_max_hallucination_refuses_an_amount_given_as_settings(tmp_path, given):
    """Settings built from a mapping (a YAML file, the notebook API) bypass argparse's exclusive group: the settings
    themselves refuse it (0.2, the default share, too), naming both keys."""
    from halsift.corpus.config import from_dict
    from halsift.filtering.selection.config import SelectConfig

    data = {"scores": [str(tmp_path / "s")], "max_hallucination": 0.1, "calibration": str(tmp_path / "c"), **given}
    name = next(iter(given))
    with pytest.raises(ConfigError, match=rf"^max_hallucination: .*drop {name}$"):
        from_dict(SelectConfig, data)


@pytest.mark.parametrize("dry", [True, False])
@pytest.mark.parametrize("how", ["yaml", "override"])
def test_a_recipe_select_section_with_keep_and_max_hallucination_is_refused(tmp_path, capsys, monkeypatch, dry, how):
    import halsift.launch.recipe as recipe

    def must_not_run(*a, **k):
        raise AssertionError("the recipe reached run_recipe")

    monkeypatch.setattr(recipe, "run_recipe", must_not_run)
    monkeypatch.chdir(tmp_path)
    if how == "yaml":
        (tmp_path / "r.yaml").write_text(f"run_dir: {tmp_path / 'run'}\nselect:\n  keep: 0.3\n"
                                         "  max_hallucination: 0.1\n")
        argv = ["run", str(tmp_path / "r.yaml")]
    else:
        argv = ["run", "quickstart", f"run_dir={tmp_path / 'run'}", "select.max_hallucination=0.1",
                "select.keep=0.2"]
    assert main([*argv, *(["--dry-run"] if dry else [])]) == 2
    err = _err(capsys)
    assert "select.max_hallucination" in err and "drop select.keep" in err


def test_max_hallucination_alone_and_keep_alone_still_load():
    from halsift.filtering.selection.config import DEFAULT_KEEP, SelectConfig, amount
    from halsift.launch.recipe_config import SelectCfg
    from halsift.corpus.config import from_dict

    assert from_dict(SelectCfg, {"max_hallucination": 0.1}, "select").keep is None
    assert from_dict(SelectCfg, {"keep": 0.4}, "select").resolved("x")[1]["keep"] == 0.4
    assert SelectCfg().resolved("x")[1]["keep"] == DEFAULT_KEEP == 0.2
    cfg = from_dict(SelectConfig, {"scores": ["s"], "max_hallucination": 0.1, "calibration": "c"})
    assert amount(cfg.keep, cfg.top_k, 37.5) == {"keep": None, "top_k": None, "threshold": 37.5}


@pytest.mark.parametrize("variant,refused", [({"keep": 0.4}, "keep"), ({"top_k": 5}, "top_k"),
                                             ({"threshold": 60.0}, "threshold"), ({"agg": "prune"}, None),
                                             ({"keep": 0.4, "agg": "repair"}, None)])
def test_a_variant_amount_under_max_hallucination_is_refused_naming_it(variant, refused):
    """Under select.max_hallucination the certified threshold decides every selection's amount: a variant's own
    keep/top_k/threshold is refused by name, not silently replaced (a repair variant keeps its amount)."""
    from halsift.corpus.config import ConfigError, from_dict
    from halsift.launch.recipe_config import SelectCfg

    data = {"max_hallucination": 0.1, "variants": {"v": {"filter": "clip", **variant}}}
    if refused is None:
        assert from_dict(SelectCfg, data, "select").variants["v"].filter == "clip"
        return
    with pytest.raises(ConfigError, match=rf"select\.variants\.v\.{refused}: select\.max_hallucination chooses"):
        from_dict(SelectCfg, data, "select")
    assert from_dict(SelectCfg, {"variants": data["variants"]}, "select").variants["v"].sets_amount()


def test_an_out_of_core_recipe_checks_each_variant_as_it_will_run():
    """select.resumable: a variant is checked with the unit and agg it runs with (its own, else the section's), so
    a caption-mean variant under a sentence-level section is refused when the recipe loads, not after scoring."""
    from halsift.corpus.config import ConfigError, from_dict
    from halsift.launch.recipe_config import SelectCfg

    ok = {"resumable": True, "unit": "sentence", "variants": {"v": {"filter": "clip", "unit": "caption", "agg": "min"}}}
    assert from_dict(SelectCfg, ok, "select").variants["v"].unit == "caption"
    bad = {**ok, "variants": {"v": {"filter": "clip", "unit": "caption", "agg": "mean"}}}
    with pytest.raises(ConfigError, match=r"select\.variants\.v: select\.resumable \(out of core\) is not for caption "
                                          r"agg=mean"):
        from_dict(SelectCfg, bad, "select")
