"""`halsift eval NAME` takes its flags from the eval's config class and keeps every flag it ever had."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from halsift.eval.registry import EVALS
from halsift.launch.cli import build_parser

OLD_FLAGS = {  # the flags of each command before they were generated from the config class
    "bench": "--bench --scores --detector --out --keep --self-preference --ensemble --likelihood --likelihood-images "
             "--n-boot --seed --no-plots --no-html",
    "retrieval": "--model --pretrained --data --out --batch-size --device",
    "ihalla": "--out --synthetic --answerer --answer-mode --prompts --seed --qa --predictions --reference",
    "vope": "--out --synthetic --images --seed --responses --unparsed --vocab",
    "vigil": "--out --synthetic --per-category --seed --annotations --root",
    "zeroshot": "--model --pretrained --data --out",  # the flags issue 33 names
    "compositional": "--model --pretrained --data --images --out",
}


def _command(name: str) -> argparse.ArgumentParser:
    def sub(p: argparse.ArgumentParser) -> dict:
        return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices

    return sub(sub(build_parser())["eval"])[name]


@pytest.mark.parametrize("name", sorted(EVALS))
def test_flags_are_the_config_fields_and_keep_the_old_names(name):
    flags = {o for a in _command(name)._actions for o in a.option_strings}
    fields = dataclasses.fields(EVALS[name].config)
    want = {"-h", "--help", "--config", "--describe"} | {"--" + f.name.replace("_", "-") for f in fields} | {
        "--no-" + f.name.replace("_", "-") for f in fields if f.type in (bool, "bool")}
    assert flags == want
    assert set(OLD_FLAGS[name].split()) <= flags


def test_describe_prints_the_eval_settings(capsys):
    from halsift.launch.cli import main

    with pytest.raises(SystemExit, match="^0$") as e:
        main(["eval", "vope", "--describe"])  # no --out needed, like --help
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "images: 100  # synthetic: images per task" in out and "vocab:" in out


def test_list_flags_add_up_over_repeats():
    args = _command("bench").parse_args(["--bench", "b.jsonl", "--scores", "a", "--scores", "c", "d",
                                         "--ensemble", "a+c", "--no-plots", "--out", "o"])
    assert args.scores == ["a", "c", "d"] and args.ensemble == ["a+c"] and args.plots is False
