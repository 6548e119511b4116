"""One path for evaluations (issue 50): every entry of the registry is a `halsift eval` command with `--describe`,
a per-model entry is run by a recipe's eval stage on every model, and an evaluation registered in the registry
alone (no other file) becomes a command."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from halsift.corpus.config import field
from halsift.eval.registry import EVALS, EvalEntry, per_model_evals
from halsift.eval.result import EvalResult
from halsift.eval.runs.per_model import ModelScores, PerModel
from halsift.launch.cli import build_parser, commands, main


def _subcommands(parser) -> dict:
    import argparse

    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize("name", list(EVALS))
def test_every_evaluation_is_a_command_with_its_settings_and_describe(name, capsys):
    entry = EVALS[name]
    command = commands()[("eval", name)]
    assert command.CONFIG is entry.config and command.HELP == entry.help
    assert _subcommands(_subcommands(build_parser())["eval"])[name].description == entry.help
    with pytest.raises(SystemExit, match="^0$"):
        main(["eval", name, "--describe"])
    described = capsys.readouterr().out
    for f in dataclasses.fields(entry.config):
        assert f"\n{f.name}: " in "\n" + described, (name, f.name)
    from halsift.launch.config_reference import reference

    assert f"### `halsift eval {name}`" in reference()


def test_the_eval_group_is_the_registry():
    assert [p[1] for p in commands() if p[0] == "eval"] == list(EVALS)
    assert set(per_model_evals()) == {"retrieval", "zeroshot", "compositional"}


@dataclass
class FakeEvalConfig:
    out: str = field("", help="writes metrics.json here")
    copies: int = field(2, help="how many copies to count")

    def validate(self) -> None:
        if self.copies < 1:
            raise ValueError(f"copies: expected >= 1, got {self.copies}")


def run_fake(config: FakeEvalConfig) -> EvalResult:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps({"fake/copies": config.copies}))
    return EvalResult({"fake/copies": config.copies}, out, out / "report.md", out / "metrics.json",
                      summary=f"fake: {config.copies} copies")


def test_an_evaluation_registered_in_the_registry_alone_is_a_command(tmp_path, monkeypatch, capsys):
    """A tiny evaluation added to EVALS before the parser is built: `halsift eval fake` takes its flags, checks
    them in one line, prints its settings and runs its library function; the config reference lists it."""
    monkeypatch.setitem(EVALS, "fake", EvalEntry(FakeEvalConfig, run_fake, "count fake copies", {"out": "DIR"}))
    assert main(["eval", "fake", "--copies", "3", "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.strip() == "fake: 3 copies"
    assert json.loads((tmp_path / "o" / "metrics.json").read_text()) == {"fake/copies": 3}
    assert main(["eval", "fake", "--copies", "0", "--out", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err.strip() == "halsift eval fake: error: --copies: expected >= 1, got 0"
    with pytest.raises(SystemExit, match="^0$"):
        main(["eval", "fake", "--describe"])
    assert "copies: 2  # how many copies to count" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^0$"):
        main(["eval", "--help"])
    assert "count fake copies" in capsys.readouterr().out
    assert "--out DIR" in _subcommands(_subcommands(build_parser())["eval"])["fake"].format_help()
    from halsift.launch.config_reference import reference

    text = reference()
    assert "### `halsift eval fake`" in text and "| `copies` | `int` | `2` | how many copies to count |" in text


def _recipe(tmp_path, *over):
    """A recipe of the eval stage alone on a folder holding only the world's evaluation sets (a retrieval set, a
    zero-shot task, a SugarCrepe folder): it evaluates the base model."""
    from halsift.corpus.config import deep_merge, from_dict, parse_overrides
    from halsift.launch.recipe_config import Recipe
    from halsift.launch.stages.base import resolve_paths

    world = tmp_path / "world"
    for sub in ("retrieval", "zeroshot/shape", "compositional"):
        (world / sub).mkdir(parents=True)
    r = from_dict(Recipe, deep_merge({"model": {"arch": "halsift-tiny"}}, parse_overrides(
        [f"run_dir={tmp_path}", "stages=[eval]", "model.pretrained=base.safetensors", *over])))
    return r, resolve_paths(r)


def _recording(monkeypatch, seen: dict) -> None:
    """Every per-model entry of the registry replaced by one that records its sets and the model it was given
    (and returns a metric and a per-sample array); loading a model gives a stand-in."""
    from halsift.filtering.models import clip_models, clip_tokenizer

    class Model:
        def eval(self):
            return self

    monkeypatch.setattr(clip_models, "load_open_clip", lambda arch, pretrained, device: (Model(), None, pretrained))
    monkeypatch.setattr(clip_tokenizer, "get_tokenizer", lambda arch: arch)
    for name, pm in per_model_evals().items():
        def evaluate(model, weights, arch, sets, device, batch_size, precision, name=name):
            # the stand-in transform is the weights' path, handed on inside the stage's PreprocessMemo
            seen.setdefault(name, []).append((weights.preprocess, arch, sets))
            return ModelScores({f"{name}/seen": 1.0}, {name: np.arange(3)})

        monkeypatch.setitem(EVALS, name, dataclasses.replace(
            EVALS[name], per_model=PerModel(dict, evaluate, pm.metrics_file, pm.arrays_file)))


def test_every_per_model_evaluation_is_run_by_the_recipe_on_every_model(tmp_path, monkeypatch):
    """The eval stage runs each per-model entry of the registry (through the registry: replaced entries are the
    ones called) on every model with its recipe sets, into the entry's files."""
    from halsift.eval.metrics.retrieval import read_ranks
    from halsift.launch.stages import eval as stage

    seen: dict = {}
    _recording(monkeypatch, seen)
    monkeypatch.setattr(stage, "finetune_runs", lambda r, p: {"oracle": [tmp_path / "s0", tmp_path / "s1"]})
    r, p = _recipe(tmp_path, "stages=[finetune, eval]")
    done = stage.stage_eval(r, p)
    world = tmp_path / "world"
    weights = ["base.safetensors", *(str(tmp_path / s / "final" / "open_clip_model.safetensors") for s in ("s0", "s1"))]
    sets = {"retrieval": {"synthetic": str(world / "retrieval")}, "zeroshot": {"shape": str(world / "zeroshot/shape")},
            "compositional": {"compositional": str(world / "compositional")}}
    assert seen == {name: [(w, "halsift-tiny", s) for w in weights] for name, s in sets.items()}
    assert done["retrieval_models"] == ["no-tune", "oracle"]
    out = tmp_path / "eval"
    assert json.loads((out / "retrieval.json").read_text()) == {"no-tune": [{"retrieval/seen": 1.0}],
                                                               "oracle": [{"retrieval/seen": 1.0}] * 2}
    both = {"zeroshot/seen": 1.0, "compositional/seen": 1.0}
    assert json.loads((out / "beyond.json").read_text()) == {"no-tune": [both], "oracle": [both] * 2}
    checkpoints = ("no-tune/0", "oracle/0", "oracle/1")
    assert set(read_ranks(out / "beyond_hits.npz")) == {f"{c}/{e}" for c in checkpoints
                                                        for e in ("zeroshot", "compositional")}
    assert set(read_ranks(out / "retrieval_ranks.npz")) == {f"{c}/retrieval" for c in checkpoints}


def test_a_turned_off_evaluation_is_not_run_and_a_per_model_entry_without_recipe_sets_is_refused(tmp_path,
                                                                                              monkeypatch):
    from halsift.launch.stages.eval import stage_eval

    seen: dict = {}
    _recording(monkeypatch, seen)
    r, p = _recipe(tmp_path, "eval.zeroshot=false", "eval.compositional=false")
    stage_eval(r, p)
    assert set(seen) == {"retrieval"}
    assert json.loads((tmp_path / "eval" / "beyond.json").read_text()) == {}
    assert not (tmp_path / "eval" / "beyond_hits.npz").exists()

    monkeypatch.setitem(EVALS, "fake", EvalEntry(FakeEvalConfig, run_fake, "fake", per_model=PerModel(
        dict, lambda *a: ModelScores({}), "fake.json", "fake.npz")))
    with pytest.raises(LookupError, match=r"^per-model evaluation\(s\) \['fake'\] of the registry: no recipe sets"):
        stage_eval(r, p)


def test_a_recipes_evals_sections_are_the_registry_entries_with_a_section():
    """`evals:` of a recipe holds one optional section per entry with `section` help: its settings class, its help."""
    from halsift.eval.registry import recipe_sections
    from halsift.launch.recipe_config import EvalsCfg

    got = {f.name: (f.type, f.default, f.metadata["help"]) for f in dataclasses.fields(EvalsCfg)}
    assert got == {name: (EVALS[name].config | None, None, EVALS[name].section) for name in recipe_sections()}
    assert recipe_sections() == ("ihalla", "vope", "vigil")
