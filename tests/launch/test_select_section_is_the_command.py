"""The recipe's select section is `halsift select`'s settings: same names, same defaults, one validation."""

import argparse
import dataclasses

import pytest

from halsift.corpus.config import config_from_args
from halsift.launch import cmd_select
from halsift.launch.recipe_config import SelectCfg


def test_every_section_field_is_the_commands_with_its_default():
    command = {f.name: f for f in dataclasses.fields(cmd_select.SelectConfig)}
    section = [f for f in dataclasses.fields(SelectCfg) if f.name != "variants"]
    assert {f.name for f in section} >= {"keep", "top_k", "threshold", "unit", "agg", "per_captioner", "captioner",
                                         "source"}
    for f in section:
        assert f.default == command[f.name].default, f.name
        assert f.metadata.get("help") == command[f.name].metadata.get("help"), f.name


def _parse(argv):
    p = argparse.ArgumentParser()
    cmd_select.add_arguments(p)
    return config_from_args(cmd_select.SelectConfig, p.parse_args(["--scores", "S", "--data", "D", "--out", "O",
                                                                  *argv]))


def test_without_an_amount_the_command_keeps_the_seeds_top_20_percent_like_a_recipe():
    cfg = _parse([])
    assert cmd_select.amount(cfg.keep, cfg.top_k, cfg.threshold) == {"keep": 0.2, "top_k": None, "threshold": None}
    assert SelectCfg().resolved("judge") == ("judge", {"keep": 0.2, "top_k": None, "threshold": None,
                                                       "unit": "sentence", "agg": "min"})
    cfg = _parse(["--top-k", "7"])
    assert cmd_select.amount(cfg.keep, cfg.top_k, cfg.threshold) == {"keep": None, "top_k": 7, "threshold": None}
    with pytest.raises(SystemExit, match="2"):
        _parse(["--top-k", "7", "--keep", "0.5"])


def test_the_same_check_names_the_flag_or_the_recipe_key():
    from halsift.corpus.config import from_dict

    with pytest.raises(ValueError, match=r"^keep: expected a value in \(0, 1\], got 1.5"):
        from_dict(cmd_select.SelectConfig, {"scores": ["S"], "data": "D", "out": "O", "keep": 1.5})
    with pytest.raises(ValueError, match=r"^select.keep: expected a value in \(0, 1\], got 1.5"):
        from_dict(SelectCfg, {"keep": 1.5}, "select")
