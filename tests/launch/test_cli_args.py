"""Command-line shape: `halsift run RECIPE --dry-run key=value` (overrides anywhere after the recipe) and
`halsift launch --describe` (its flags built from one config class, LaunchConfig, like the other commands')."""

from __future__ import annotations

import dataclasses

import pytest

from halsift.corpus.config import field_default
from halsift.launch.cli import build_parser, main


def test_overrides_after_dry_run_and_force_are_applied(tmp_path, capsys):
    run = tmp_path / "elsewhere"
    assert main(["run", "quickstart", "--dry-run", f"run_dir={run}"]) == 0, capsys.readouterr().err
    assert f"run folder {run})" in capsys.readouterr().out
    # split around flags, in command-line order (the last word for a key wins)
    assert main(["run", "quickstart", "seed=3", "--dry-run", "--force", "score", f"run_dir={tmp_path / 'a'}",
                 f"run_dir={run}"]) == 0
    assert f"run folder {run})" in capsys.readouterr().out
    # and they are checked like the others
    assert main(["run", "quickstart", "--dry-run", "select.keep=1.5"]) == 2
    assert "select.keep" in capsys.readouterr().err


def test_other_commands_still_refuse_stray_words(capsys):
    with pytest.raises(SystemExit, match="^2$") as e:
        main(["stats", "a", "b"])
    assert e.value.code == 2 and "unrecognized arguments: b" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="^2$"):
        main(["run", "quickstart", "--dry-run", "--bogus", "a=1"])
    assert "unrecognized arguments: --bogus a=1" in capsys.readouterr().err


def test_force_names_a_stage(capsys):
    assert main(["run", "quickstart", "--dry-run", "--force", "scroe"]) == 2
    assert capsys.readouterr().err.startswith("halsift run: error: --force: unknown stage 'scroe'")


def test_launch_describe_lists_every_flag_with_default_and_meaning(capsys):
    from halsift.launch.cmd_launch import LaunchConfig

    with pytest.raises(SystemExit, match="^0$") as e:
        main(["launch", "--describe"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(LaunchConfig):
        assert out.count(f"\n{f.name}: ") + out.startswith(f"{f.name}: ") == 1, f.name
    assert "time: '24:00:00'  # wall-time limit" in out and "cpus_per_task: 32  #" in out
    assert "array: null  # a job array of N independent" in out


def test_launch_flags_come_from_its_config_class():
    """Every LaunchConfig field is a flag whose unset value is the field's default; repeatable flags add up."""
    from halsift.launch.cmd_launch import LaunchConfig

    args = build_parser().parse_args(["launch", "--", "score"])
    for f in dataclasses.fields(LaunchConfig):
        assert getattr(args, f.name) == field_default(f), f.name
    args = build_parser().parse_args(["launch", "--setup", "a b", "--setup", "c", "--sbatch-extra=--x=1", "--",
                                      "score", "--setup", "d"])
    assert args.setup == ["a b", "c"] and args.sbatch_extra == ["--x=1"]
    assert args.argv == ["--", "score", "--setup", "d"]


def test_launch_is_in_the_config_reference():
    from halsift.launch.config_reference import reference

    text = reference()
    assert "### `halsift launch`" in text and "| `sbatch_extra` | `list[str]` | `[]` |" in text
