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
