"""Issue 35, trust in recipes: a recipe's own spec text is the user's (it may set ``trust_remote_code`` and
``api_key_env``, and ``--dry-run`` says so); a spec file it names is not, at any depth, and the dry run applies the
same rule as loading; ``{trained.NAME}`` carries the grant of the recipe's own ``detectors.NAME.base``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from halsift.launch.cli import main


def _recipe(tmp_path: Path, scored: dict, **extra) -> Path:
    """A score-only recipe on user data (nothing to generate) with ``score.detectors = scored``."""
    bench = tmp_path / "bench.jsonl"
    bench.write_text("")
    recipe = {"name": "t", "run_dir": str(tmp_path / "run"), "stages": ["score"], "world": {"enabled": False},
              "data": {"bench": str(bench)}, "model": {"arch": "halsift-tiny"}, "score": {"detectors": scored},
              **extra}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _yaml(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("member", ["api:base_url=http://127.0.0.1:9/v1,model=j,api_key_env =SECRET",
                                    {"family": "api", "base_url": "http://127.0.0.1:9/v1", "model": "j",
                                     "API-KEY-ENV": "SECRET"}], ids=["spaced-string", "hyphen-upper-dict"])
def test_dry_run_refuses_api_key_env_nested_in_a_spec_file(tmp_path, capsys, member):
    inner = _yaml(tmp_path / "inner.yaml", {"family": "ensemble", "members": [member, "random"]})
    outer = _yaml(tmp_path / "shared.yaml", {"family": "ensemble", "members": [inner, "oracle"]})
    assert main(["run", str(_recipe(tmp_path, {"judge": outer})), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("halsift run: error: score.detectors.judge:")
    assert "inner.yaml: api_key_env='SECRET' is refused" in err[0]


def test_dry_run_warns_when_a_spec_file_asks_for_remote_code(tmp_path, capsys):
    inner = _yaml(tmp_path / "inner.yaml", {"family": "vlm", "model": "some/model", "Trust-Remote-Code": True})
    outer = _yaml(tmp_path / "shared.yaml", {"family": "ensemble", "members": [inner, "oracle"]})
    with pytest.warns(UserWarning, match=r"inner\.yaml: trust_remote_code ignored"):
        assert main(["run", str(_recipe(tmp_path, {"judge": outer})), "--dry-run"]) == 0
    assert "trust_remote_code" not in capsys.readouterr().out  # nothing of the file's is granted


def test_the_recipes_own_text_may_set_them_and_the_dry_run_names_them(tmp_path, capsys):
    spec = "ensemble:members=[api:base_url=http://127.0.0.1:9/v1,model=j,api_key_env = MY_KEY;oracle]"
    path = _recipe(tmp_path, {"judge": spec, "plain": "random:seed=0"})
    assert main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "api_key_env" in line]
    assert len(notes) == 1 and "score.detectors.judge" in notes[0] and "api_key_env=MY_KEY" in notes[0]
    assert "score.detectors.plain" not in out


def test_trained_detector_carries_the_grant_of_the_recipes_own_base(tmp_path):
    from halsift.launch.cmd_run import load_recipe
    from halsift.launch.stages import resolve_paths
    from halsift.launch.stages.score import detector_specs

    path = _recipe(tmp_path, {"tuned": "{trained.j}", "other": "{trained.k}"}, stages=["detectors", "score"],
                   detectors={"j": {"base": "vlm:model=some/model, Trust-Remote-Code=true"},
                              "k": {"base": "vlm:model=some/model"}})
    r = load_recipe(str(path), [])
    specs = detector_specs(r, resolve_paths(r))
    adapter = tmp_path / "run" / "detectors"
    assert specs == {"tuned": f"lora:{adapter / 'j' / 'adapter'},trust_remote_code=true",
                     "other": f"lora:{adapter / 'k' / 'adapter'}"}


def test_dry_run_names_the_grant_in_a_trained_base_and_where_it_goes(tmp_path, capsys):
    path = _recipe(tmp_path, {"tuned": "{trained.j}"}, stages=["detectors", "score"],
                   detectors={"j": {"base": "vlm:model=some/model,TRUST_REMOTE_CODE=true"}})
    assert main(["run", str(path), "--dry-run"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "trust_remote_code=true" in line]
    assert [n.split(":")[0] for n in notes] == ["[halsift run] detectors.j.base", "[halsift run] score.detectors.tuned"]
