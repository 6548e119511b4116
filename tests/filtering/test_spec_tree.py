"""Issue 51, rule 2 (causes 2 and 8): specs are checked as trees. A family that runs as a staged job (its class
declares ``staged = True``: the cascade) is refused anywhere but the top of a spec, by ``check_spec`` and by every
build (``load_detector``), so ``score``, ``eval bench``, a recipe's ``--dry-run`` and the notebook API refuse it
the same way, in one line naming the place in the tree, before anything is scored."""

from __future__ import annotations

import pytest
from cli_cases import _err_line
from filtering_data import make_bench, make_corpus

from halsift.filtering.detectors.base import STAGED, Detector, Result
from halsift.filtering.detectors.spec import SpecError, check_spec, family_staged, load_detector, spec_tree
from halsift.launch.cli import main

CAS = "cascade:cheap=[random:seed=0],judge=[oracle]"

PLACES = [  # (spec, the place the line names)
    (f"ensemble:members=[{CAS};oracle]", "members[0]"),
    (f"ensemble:members=[oracle;random:seed=1;{CAS}],weights=[1,1,1]", "members[2]"),
    (f"cascade:cheap=[{CAS}],judge=[oracle]", "cheap"),  # cause 2: reached the per-batch runner (AttributeError)
    (f"cascade:cheap=[random:seed=0],judge=[{CAS}]", "judge"),  # refused before, late and by another rule
    (f"cascade:cheap=[ensemble:members=[oracle;{CAS}]],judge=[oracle]", "cheap.members[1]"),
    (f"cascade:cheap=[random:seed=0],judge=[ensemble:members=[oracle;{CAS}],norm=zscore]", "judge.members[1]"),
    (f"subset:detector=[{CAS}],keys=k.parquet", "detector"),
]


@pytest.mark.parametrize("spec, place", PLACES)
def test_check_spec_and_the_build_refuse_a_staged_family_below_the_top(spec, place):
    for check in (check_spec, load_detector):
        with pytest.raises(SpecError, match=rf": {__import__('re').escape(place)} is a cascade spec, which runs as a "
                                            r"staged job .*it can only be the whole spec"):
            check(spec)


def test_the_top_of_a_spec_may_be_staged():
    assert [n[0] for n in spec_tree(CAS)] == ["", "cheap", "judge"]
    check_spec(CAS)
    assert STAGED in load_detector(CAS).capabilities()


def test_a_yaml_spec_file_is_the_same_tree(tmp_path):
    f = tmp_path / "ens.yaml"
    f.write_text(f"family: ensemble\nmembers: ['oracle', '{CAS}']\n")
    with pytest.raises(SpecError, match=r"members\[1\] is a cascade spec"):
        check_spec(str(f))
    g = tmp_path / "cas.yaml"
    g.write_text("family: cascade\ncheap: {family: random, seed: 0}\njudge: {family: cascade, cheap: oracle, "
                 "judge: oracle}\n")
    with pytest.raises(SpecError, match="judge is a cascade spec"):
        load_detector(str(g))


class _Staged(Detector):
    """A family of the test's own that declares the capability: the rule reads the class, not a list of names."""

    family = "mystaged"
    staged = True
    OPTION_HELP: dict = {}

    def score_batch(self, items):
        return [Result(50.0) for _ in items]


@pytest.fixture()
def staged_family():
    from registered import registered

    with registered("mystaged", _Staged):
        yield


def test_staged_is_a_declared_property_of_the_family_class(staged_family):
    assert family_staged("mystaged") and family_staged("cascade") and not family_staged("ensemble")
    check_spec("mystaged")
    with pytest.raises(SpecError, match=r"members\[1\] is a mystaged spec"):
        check_spec("ensemble:members=[oracle;mystaged]")


def test_an_adapters_base_is_refused_when_it_is_built(tmp_path):
    """A lora adapter's detector.yaml is not walked by the check (an adapter folder is not opened), so the build
    refuses a staged base itself."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "detector.yaml").write_text(f"kind: clip\nbase: '{CAS}'\n")
    with pytest.raises(SpecError, match=r"detector spec 'lora:.*adapter': 'cascade:.*' is a cascade spec, which "
                                        r"runs as a staged job"):
        load_detector(f"lora:{adapter}")


# ------------------------------------------------------------------------------------------ every command alike
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("tree")
    return make_corpus(d / "corpus", shards=1, per_shard=6), make_bench(d / "bench", captions=4)


@pytest.mark.parametrize("spec, place", PLACES[:6])
def test_score_refuses_it_before_scoring_anything(data, tmp_path, capsys, spec, place):
    corpus, _ = data
    assert main(["score", "--detector", spec, "--data", str(corpus), "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 2
    line = _err_line(capsys)
    assert f"{place} is a cascade spec" in line, line
    assert not list(tmp_path.glob("o/**/*.parquet"))  # nothing scored, no stage ran


@pytest.mark.parametrize("spec, place", PLACES[:1] + PLACES[3:4])
def test_eval_bench_refuses_it(data, tmp_path, capsys, spec, place):
    _, bench = data
    assert main(["eval", "bench", "--bench", str(bench), "--detector", spec, "--out", str(tmp_path / "e")]) == 2
    assert f"{place} is a cascade spec" in _err_line(capsys)


@pytest.mark.parametrize("spec, place", PLACES[:6])
def test_a_recipe_dry_run_refuses_it_naming_the_key(tmp_path, capsys, monkeypatch, spec, place):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "quickstart", "--dry-run", f"score.detectors.x={spec}"]) == 2
    line = _err_line(capsys)
    assert "score.detectors.x" in line and f"{place} is a cascade spec" in line, line


def test_the_notebook_api_refuses_it(data):
    import halsift

    corpus, _ = data
    with pytest.raises(SpecError, match=r"members\[0\] is a cascade spec"):
        halsift.load_detector(PLACES[0][0])
