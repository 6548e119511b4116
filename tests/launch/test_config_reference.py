"""The config reference (docs/config.md) is generated from the config classes and current; command flags and
``--describe`` come from the same classes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from halsift.corpus.config import field_default
from halsift.launch.cli import build_parser, main
from halsift.launch.config_reference import command_configs, reference

ROOT = Path(__file__).parents[2]

# the smallest argv each command parses with (required flags and positionals)
MINIMAL = {"score": ["--detector", "oracle", "--data", "d", "--out", "o"],
           "select": ["--scores", "s", "--data", "d", "--out", "o", "--keep", "0.5"],
           "stats": ["p"], "synth": ["--out", "o"], "convert": ["coco", "src", "--out", "o"]}


def test_docs_config_md_is_current():
    text = (ROOT / "docs" / "config.md").read_text()
    assert text == reference(), "docs/config.md is stale: python -m halsift.launch.config_reference > docs/config.md"


def test_reference_lists_every_setting():
    text = reference()
    for name, cls in command_configs():
        assert f"### `halsift {name}`" in text
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in text, (name, f.name)
    for key in ("finetune.grad_accum", "select.top_k", "select.variants.NAME.threshold", "world.captioners",
                "detectors.NAME.options.lora_r", "detectors.NAME.options.pmi_references"):
        assert f"| `{key}` |" in text, key
    assert "### `clip:`" in text and "| `center` | `float` in `[-1, 1]` | `0.25` |" in text
    # declared ranges: a command's setting, a recipe key (the same field), a detector option
    assert "| `batch_size` | `int` in `[1, inf)` | `64` |" in text and "| `finetune.lr` | `float` in `[0, inf)` |" in text
    assert "| `budget` | `float` in `(0, 1]` | `0.25` |" in text
    assert "| `model` | `str` | `(required)` |" in text and "| `max_pixels` | `int` in `[0, inf)` | `DEFAULT_MAX_PIXELS` |" in text


def test_docs_link_the_reference():
    for doc in ("README.md", "docs/DESIGN.md"):
        assert "config.md" in (ROOT / doc).read_text(), doc


@pytest.mark.parametrize("command", sorted(MINIMAL))
def test_command_flags_come_from_its_config_class(command):
    """Every field is a flag (or positional) whose unset value is the field's default."""
    cls = dict(command_configs())[command]
    args = build_parser().parse_args([command, *MINIMAL[command]])
    given = {a.lstrip("-").replace("-", "_") for a in MINIMAL[command] if a.startswith("--")}
    for f in dataclasses.fields(cls):
        assert hasattr(args, f.name), f.name
        if f.name not in given and not f.metadata.get("cli", {}).get("positional"):
            assert getattr(args, f.name) == field_default(f), f.name


def test_describe_prints_the_settings_and_detector_options(capsys):
    with pytest.raises(SystemExit, match="^0$") as e:
        main(["score", "--describe"])  # no --detector/--data/--out needed, like --help
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "batch_size: 64  # items per detector call" in out and "decode_workers: 0" in out
    assert "clip: arch: str = 'ViT-B-32', pretrained: str | None = None, checkpoint" in out
    assert "ensemble: members: list = (), weights: list[float] | None in [0, inf) = None, norm: str = 'none'" in out
    assert "budget: float in (0, 1] = 0.25" in out  # a family's declared ranges
    assert "max_parse_failures: 0.2  # " in out and "(in [0, 1])" in out  # a setting's
    assert "vlm: model: str (required), mode: str = 'logits'" in out
    with pytest.raises(SystemExit, match="^0$"):
        main(["select", "--describe"])
    assert "top_k: null  # number of units to keep" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^0$"):
        main(["run", "--describe"])
    out = capsys.readouterr().out
    assert "  grad_accum: 1  # micro-batches per optimizer step" in out and "lora: path: str (required), merge: bool = False" in out


def test_command_errors_name_the_flag(tmp_path, capsys):
    assert main(["synth", "--out", str(tmp_path / "w"), "--image-size", "8"]) == 2
    assert capsys.readouterr().err.strip() == "halsift synth: error: --image-size: expected a value in [32, inf), got 8"
    assert main(["convert", "coco", "src", "--out", str(tmp_path / "o"), "--maxcount", "0"]) == 2
    assert "--maxcount: expected a value in [1, inf), got 0" in capsys.readouterr().err
    assert main(["select", "--scores", "s", "--data", "d", "--out", str(tmp_path / "o"), "--top-k", "-2"]) == 2
    assert "--top-k: expected a value in [0, inf), got -2" in capsys.readouterr().err
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()
