"""Typed YAML configs: unknown keys, types, overrides."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from halsift.corpus.config import ConfigError, deep_merge, describe, field, from_dict, load_yaml, parse_overrides


@dataclass
class Inner:
    lr: float = field(1e-3, help="learning rate")
    loss: Literal["clip", "siglip"] = field("clip", help="contrastive loss")

    def validate(self):
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass
class Outer:
    steps: int = field(10, help="optimizer steps")
    inner: Inner = field(default_factory=Inner, help="optimizer")
    detectors: list[str] = field(default_factory=lambda: ["oracle"], help="detector specs")
    out: str | None = field(None, help="output folder")


def test_defaults_and_nested_overrides():
    cfg = from_dict(Outer, deep_merge({"steps": 3}, parse_overrides(["inner.lr=0.5", "detectors=[a, b]"])))
    assert cfg.steps == 3 and cfg.inner.lr == 0.5 and cfg.inner.loss == "clip" and cfg.detectors == ["a", "b"]
    assert from_dict(Outer, {}).detectors == ["oracle"]


@pytest.mark.parametrize("data, key", [({"stepz": 1}, "stepz"), ({"inner": {"los": "x"}}, "inner.los"),
                                       ({"inner": {"loss": "x"}}, "inner.loss"), ({"steps": "ten"}, "steps"),
                                       ({"steps": True}, "steps"), ({"detectors": "oracle"}, "detectors"),
                                       ({"inner": {"lr": -1.0}}, "lr")])
def test_errors_name_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        from_dict(Outer, data)


def test_bad_override_and_yaml(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["steps"])
    bad = tmp_path / "r.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="r.yaml"):
        load_yaml(bad)
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_yaml(tmp_path / "nope.yaml")


def test_describe_lists_every_field_with_its_help():
    text = describe(Outer)
    for line in ("steps: 10  # optimizer steps", "  lr: 0.001  # learning rate", "detectors: [oracle]"):
        assert line in text


@dataclass
class Typed:
    path: Path = field(Path("."), help="a path")
    flag: bool = field(False, help="a switch")
    name: str = field("x", help="a name")
    ratio: float = field(0.5, help="a number")
    either: int | list[int] = field(0, help="one or several")
    entries: dict[str, Inner] = field(default_factory=dict, help="named optimizers")


@pytest.mark.parametrize("data, message", [
    ({"flag": 1}, "flag: expected true/false, got 1"), ({"flag": "yes"}, "flag: expected true/false, got 'yes'"),
    ({"name": 2017}, "name: expected a string, got 2017"), ({"ratio": "0.5"}, "ratio: expected a number, got '0.5'"),
    ({"either": "a"}, "either: 'a' matches none of ['int', 'list[int]']"),
    ({"entries": {"a": {"lr": "fast"}}}, "entries.a.lr: expected a number, got 'fast'"),
    ({"entries": {"a": {"lrr": 1}}}, "unknown key 'entries.a.lrr' (known: loss, lr)"),
    ({"entries": {"a": {"lr": 0}}}, "entries.a: lr must be > 0, got 0.0"),
    ({"path": 3}, "path: expected a path, got 3"),
])
def test_strict_types_one_line_each(data, message):
    """Strict (pydantic strict mode): no "1" -> 1, 1 -> true or 2017 -> "2017" behind the user's back."""
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$") as e:
        from_dict(Typed, data, prefix="")
    assert str(e.value) == message


def test_lenient_where_yaml_is_unambiguous():
    cfg = from_dict(Typed, {"path": "a/b", "ratio": 1, "either": [1, 2], "entries": {"a": {"lr": 2}}})
    assert cfg.path == Path("a/b") and cfg.ratio == 1.0 and isinstance(cfg.ratio, float) and cfg.either == [1, 2]
    assert cfg.entries["a"] == Inner(lr=2.0)
    with pytest.raises(ConfigError, match=r"^top\.steps: expected an integer, got '3'$"):
        from_dict(Outer, {"steps": "3"}, prefix="top")
