"""Typed YAML configs: unknown keys, types, overrides."""

from __future__ import annotations

from dataclasses import dataclass
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
