"""Names are names: a recipe key that becomes a folder is one safe path component, refused by the dry run in one
line naming the key; and nothing a run removes or replaces lies outside its run folder (corpus/safe_paths.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from filtering_data import make_bench, make_corpus

from halsift.launch.cli import main

RECIPE = """
name: names
run_dir: {run}
stages: [score, select]
world: {{enabled: false}}
data: {{corpus: {corpus}, bench: {bench}/bench.jsonl}}
score: {{detectors: {{random: "random:seed=1", oracle: oracle}}}}
wandb: {{mode: disabled}}
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("names-data")
    make_bench(root / "bench", captions=4)
    return make_corpus(root / "corpus", shards=2, per_shard=4), root / "bench"


@pytest.fixture
def recipe(tmp_path, data) -> Path:
    corpus, bench = data
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(run=tmp_path / "run", corpus=corpus, bench=bench))
    return path


def _dry(recipe: Path, capsys, *overrides: str) -> tuple[int, str]:
    code = main(["run", str(recipe), *overrides, "--dry-run"])
    return code, capsys.readouterr().err


def test_the_test_recipe_itself_is_fine(recipe, capsys):
    code, err = _dry(recipe, capsys)
    assert code == 0, err


@pytest.mark.parametrize("override, key", [
    # the cases: a detector name that climbs out of run_dir, a variant that is run_dir itself
    ('score.detectors={"../../victim": "random:seed=1"}', "score.detectors.../../victim"),
    ('select.variants={"..": {filter: random}}', "select.variants..."),
    # variants of the rule
    ('score.ensembles={"../e": [random, oracle]}', "score.ensembles.../e"),
    ('score.detectors={"/abs/x": oracle}', "score.detectors./abs/x"),
    ('score.detectors={"a\\\\b": oracle}', "score.detectors.a\\b"),
    ('score.detectors={".": oracle}', "score.detectors..: '.'"),
    ('score.detectors={"": oracle}', "score.detectors.: ''"),
    ('score.detectors={"-rf": oracle}', "score.detectors.-rf"),
    ('score.detectors={".hidden": oracle}', "score.detectors..hidden"),
    ('score.detectors={"_done.json": oracle}', "score.detectors._done.json"),
    ('score.detectors={"{a,b}": oracle}', "score.detectors.{a,b}"),
    ('score.detectors={"a b": oracle}', "score.detectors.a b"),
    ('select.variants={"x\\ny": {filter: random}}', "select.variants: 'x\\ny'"),
    ('select.variants={"x\\ry": {filter: random}}', "select.variants: 'x\\ry'"),
    ('select.variants={"x\\0y": {filter: random}}', "select.variants: 'x\\x00y'"),
    (f'score.detectors={{"{"d" * 101}": oracle}}', "score.detectors: 'ddd"),
    (('detectors={"../t": {kind: lora, base: "clip:arch=ViT-B-32"}}', "stages=[detectors, score, select]"),
     "detectors.../t"),
    ("eval.bench_split=/../../x", "eval.bench_split: '/../../x'"),
    ("finetune.bench_split=a/b", "finetune.bench_split: 'a/b'"),
    # names the run would otherwise share: a detector's folder, the report's own rows
    ("score.ensembles={random: [random, oracle]}", "score.ensembles.random: the name is already a detector"),
    ("select.variants={unfiltered: {filter: random}}", "select.variants.unfiltered: the name is reserved"),
    ("score.detectors.no-tune=oracle", "score.detectors.no-tune: the name is reserved"),
])
def test_a_name_that_is_not_a_folder_name_is_refused_by_the_dry_run(recipe, capsys, override, key):
    code, err = _dry(recipe, capsys, *((override,) if isinstance(override, str) else override))
    assert code == 2 and err.startswith(f"halsift run: error: {key}") and err.count("\n") == 1, err
    assert not (recipe.parent / "run").exists()


def test_names_with_the_allowed_characters_pass(recipe, capsys):
    code, err = _dry(recipe, capsys, 'select.variants={"o@0.5": {filter: oracle, keep: 0.5}, '
                                     '"r+o_v2.1=x": {filter: random}}', 'score.ensembles={"r+o": [random, oracle]}',
                     "eval.bench_split=test")
    assert code == 0, err


def _bypassing_validation(recipe: Path, **changes):
    """The test recipe as a Recipe object with ``changes`` set after validation (what a caller of the library,
    or a bug in the checks, could hand to run_recipe)."""
    from halsift.launch.cmd_run import load_recipe

    r = load_recipe(str(recipe), [])
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        setattr(getattr(r, section), key, value)
    return r


def _raised(call) -> BaseException | None:
    try:
        call()
    except Exception as e:  # noqa: BLE001 -- the tests check what was left on disk first, then the error
        return e
    return None


def test_a_detector_named_out_of_the_run_folder_neither_writes_nor_deletes_there(tmp_path, recipe):
    """The issue's case, past the checks: `score.detectors: {"../../victim": ...}` with stages [score, select]
    removed <run_dir>/../victim (select cleared its 'selection' folder). Now the run stops before writing."""
    from halsift.launch.recipe import run_recipe

    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    (victim / "keep" / "data.txt").write_text("precious")
    r = _bypassing_validation(recipe, score__detectors={"../../victim": "random:seed=1"})
    error = _raised(lambda: run_recipe(r))
    assert sorted(p.name for p in victim.rglob("*")) == ["data.txt", "keep"], "written to or removed outside run_dir"
    assert type(error).__name__ == "UnsafePathError", error
    assert "'../../victim' is not a safe folder name" in str(error)


def test_a_variant_named_dotdot_does_not_empty_the_run_folder(tmp_path, recipe):
    """A select variant named '..' cleared <run_dir>/select/.. = <run_dir> (every stage's output)."""
    from halsift.launch.recipe import run_recipe
    from halsift.launch.recipe_config import SelectVariantCfg

    r = _bypassing_validation(recipe, select__variants={"..": SelectVariantCfg(filter="random")})
    error = _raised(lambda: run_recipe(r))
    run = tmp_path / "run"
    assert (run / "score" / "_done.json").exists() and (run / "select" / "random" / "manifest.json").exists(), \
        "the run folder was emptied"
    assert type(error).__name__ == "UnsafePathError" and "'..' is not a safe folder name" in str(error), error


# ------------------------------------------------------------------------------------------------ the remover
def test_removals_inside_a_run_folder_stay_inside_it(tmp_path):
    from halsift.corpus.safe_paths import UnsafePathError, confined_to, remove_file, remove_tree, replace_path

    run, outside = tmp_path / "run", tmp_path / "outside"
    (run / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (outside / "f.txt").write_text("x")
    (run / "escape").symlink_to(outside, target_is_directory=True)
    (run / "link.txt").symlink_to(outside / "f.txt")
    with confined_to(run):
        for target in (run, run / "select" / "..", run / ".." / "outside", tmp_path, run / "escape",
                       run / "escape" / "f.txt"):
            with pytest.raises(UnsafePathError, match="not inside the run folder"):
                remove_tree(target, ignore_errors=True)
        with pytest.raises(UnsafePathError, match="not inside the run folder"):
            replace_path(run / "a", outside / "moved")
        with pytest.raises(UnsafePathError, match="not inside the run folder"):
            remove_file(run / "escape" / "f.txt")
        remove_file(run / "link.txt")  # the link itself lies inside: removed, not what it points to
        remove_tree(run / "a" / "b")
        replace_path(run / "a", run / "c")
    assert (outside / "f.txt").read_text() == "x" and not (run / "link.txt").exists()
    assert sorted(p.name for p in run.iterdir()) == ["c", "escape"]


def test_never_the_current_folder_or_above_it(tmp_path, monkeypatch):
    from halsift.corpus.safe_paths import UnsafePathError, remove_tree

    work = tmp_path / "w" / "here"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for target in (".", "..", str(tmp_path), "/", os.path.expanduser("~")):
        with pytest.raises(UnsafePathError, match="the current folder or a folder above it"):
            remove_tree(target, ignore_errors=True)
    assert work.is_dir()


def test_a_helper_under_a_run_folder_refuses_to_clear_it(tmp_path):
    """The execution layer's clear_unless (what a recipe stage calls on a folder it owns whole) given select/.. under
    the run's confinement."""
    from halsift.corpus.safe_paths import UnsafePathError, confined_to
    from halsift.execution.run_folder import clear_unless

    run = tmp_path / "run"
    (run / "score").mkdir(parents=True)
    (run / "select").mkdir()
    (run / "score" / "part.parquet").write_bytes(b"x")
    with confined_to(run), pytest.raises(UnsafePathError, match="not inside the run folder"):
        clear_unless(run / "select" / "..", {"keep": 0.2})
    assert (run / "score" / "part.parquet").exists()
