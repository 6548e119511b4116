"""Issue 51, rule 1: every option value is checked before use against the range declared where it is declared
(``field(..., range=...)``; a detector family's ``OPTION_RANGES``), with one interval parser (corpus/ranges.py)."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from halsift.corpus.config import ConfigError, config_from_args, field, from_dict
from halsift.corpus.ranges import byte_size, in_interval, machine_memory, parse_interval, range_problem


@dataclasses.dataclass
class Inner:
    rate: float = field(0.5, range="(0, 1]", help="a share")


@dataclasses.dataclass
class Settings:
    steps: int = field(10, range="[1, inf)", help="steps")
    lr: float = field(1e-3, range="[0, inf)", help="learning rate")
    limit: int | None = field(None, range="[1, inf)", help="unset: no limit")
    weights: list[float] = field(default_factory=list, range="(0, inf)", help="one weight per input")
    memory: str | None = field(None, range="[16MB, RAM]", help="a size")
    inner: Inner = field(default_factory=Inner, help="a section")
    seed: int = field(0, help="no range: any integer")


@pytest.mark.parametrize("data, message", [
    ({"steps": 0}, "steps: expected a value in [1, inf), got 0"),
    ({"lr": math.nan}, "lr: expected a finite value in [0, inf), got nan"),
    ({"lr": math.inf}, "lr: expected a finite value in [0, inf), got inf"),
    ({"lr": -1e-9}, "lr: expected a value in [0, inf), got -1e-09"),
    ({"limit": 0}, "limit: expected a value in [1, inf), got 0"),
    ({"weights": [1.0, 0.0]}, "weights: expected a value in (0, inf), got 0.0 (in [1.0, 0.0])"),
    ({"memory": "abc"}, "memory: expected a size such as 512MB or 2GiB"),
    ({"memory": "1MB"}, "memory: expected a size in [16MB, RAM] (RAM: this machine's memory"),
    ({"inner": {"rate": 0}}, "inner.rate: expected a value in (0, 1], got 0"),
])
def test_a_value_outside_its_declared_range_is_one_line_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=r"^[\w.]+: expected ") as e:
        from_dict(Settings, data)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_values_inside_their_ranges_and_unset_ones_pass():
    s = from_dict(Settings, {"steps": 1, "lr": 0.0, "weights": [0.5, 2], "memory": "2GiB", "inner": {"rate": 1},
                             "seed": -7})
    assert (s.steps, s.limit, s.memory, s.seed) == (1, None, "2GiB", -7)


def test_a_flag_is_named_as_the_user_typed_it():
    import argparse

    with pytest.raises(ConfigError, match=r"^--lr: expected a finite value in \[0, inf\), got nan$"):
        config_from_args(Settings, argparse.Namespace(lr=math.nan))


def test_a_malformed_declaration_fails_where_it_is_declared():
    with pytest.raises(ValueError, match="not an interval"):
        field(1, range="1..10", help="x")
    with pytest.raises(ValueError, match="not an interval"):
        field(1, range="[1, lots)", help="x")


def test_the_one_interval_parser():
    assert in_interval(1, "(0, 1]") and not in_interval(0, "(0, 1]") and in_interval(0, "[0, 1)")
    assert not in_interval(math.nan, "[0, inf]") and in_interval(math.inf, "[0, inf]")
    assert not in_interval(math.inf, "[0, inf)") and not in_interval(-math.inf, "(-inf, 0]")
    assert parse_interval("[16MB, RAM]").sized and parse_interval("[16MB, RAM]").hi == machine_memory()
    assert not parse_interval("[0, 1]").sized
    assert range_problem(True, "[2, 3]") is None and range_problem("text", "[0, 1]") is None  # left to the types
    # the detector families' parser is this one (spec re-exports it)
    from halsift.filtering.detectors import spec

    assert spec.in_interval is in_interval


@pytest.mark.parametrize("text, n", [("512MB", 512 * 10 ** 6), ("2 GiB", 2 * 2 ** 30), ("1.5gb", 15 * 10 ** 8),
                                     (".5TB", 5 * 10 ** 11), ("100 megabytes", 10 ** 8), ("7 bytes", 7),
                                     (" 1KiB ", 1024)])
def test_sizes_are_read_with_duckdbs_units(text, n):
    assert byte_size(text) == n


@pytest.mark.parametrize("text", ["abc", "0", "1e3", "1e3GB", "1_000MB", "-1GB", "80%", "nanGB", "1 mebibyte", ""])
def test_anything_duckdb_would_misread_or_refuse_is_not_a_size(text):
    with pytest.raises(ValueError, match="expected a size such as 512MB"):
        byte_size(text)


# every number a user sets has a declared range, or is listed here with the reason it has none
UNBOUNDED = {
    "corpus_sentences": "[lo, hi] pair, checked by check_corpus_sentences",
    "world.corpus_sentences": "the same",
    "vision_layer": "the world judge's LLaVA feature layer: an index, negative from the end",
}


def _numeric(tp) -> bool:
    args = typing.get_args(tp) or (tp,)
    return any(a in (int, float) or (typing.get_origin(a) is list and typing.get_args(a)[:1] in ((int,), (float,)))
               for a in args)


def _unranged(cls: type, prefix: str = "") -> list[str]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        entry = typing.get_args(tp)[1] if typing.get_origin(tp) is dict and len(typing.get_args(tp)) == 2 else None
        if dataclasses.is_dataclass(tp):
            out += _unranged(tp, f"{prefix}{f.name}.")
        elif entry is not None and dataclasses.is_dataclass(entry):
            out += _unranged(entry, f"{prefix}{f.name}.NAME.")
        elif _numeric(tp) and not f.metadata.get("range"):
            out.append(prefix + f.name)
    return out


def test_every_number_a_user_sets_has_a_declared_range():
    from halsift.launch.config_reference import command_configs
    from halsift.launch.recipe_config import Recipe
    from halsift.synth.world_judge_config import WorldJudgeSettings
    from halsift.training.caption_pretrain import CaptionPretrainConfig

    missing = {f"{name}: {key}" for name, cls in command_configs() for key in _unranged(cls)
               if key not in UNBOUNDED}
    missing |= {f"recipe: {key}" for key in _unranged(Recipe) if key not in UNBOUNDED}
    missing |= {f"{cls.__name__}: {key}" for cls in (WorldJudgeSettings, CaptionPretrainConfig)
                for key in _unranged(cls) if key not in UNBOUNDED}
    assert not missing, sorted(missing)


def test_every_numeric_detector_option_has_a_declared_range():
    from halsift.filtering.detectors.spec import families, family_config

    missing = [f"{fam}: {key}" for fam in families() for key in _unranged(family_config(fam))]
    assert not missing, missing
