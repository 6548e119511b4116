"""Every flag of every command is a declared setting: it appears in the command's ``--describe`` and in its
sections of docs/config.md, both generated from the same settings classes (issue 30: "settings declared once")."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest

from halsift.launch.cli import commands

COMMANDS = commands()  # path -> module or generated command (`eval NAME`, from the evaluations registry)

ROOT = Path(__file__).parents[2]
NOT_SETTINGS = {"help", "describe", "config"}  # argparse's own and the settings printers / YAML loader


def _parser(command) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="halsift")
    command.add_arguments(p)
    return p


def _settings(p: argparse.ArgumentParser) -> set[str]:
    """The settings a parser takes, as field names: ``--batch-size`` -> batch_size, ``--no-x`` of ``--x`` -> x,
    positionals by their dest."""
    names = set()
    for a in p._actions:
        if not a.option_strings:  # a positional; the command words after `--` (launch) are not a setting
            if a.dest not in (argparse.SUPPRESS, "help") and a.nargs != argparse.REMAINDER:
                names.add(a.dest)
            continue
        longs = [s for s in a.option_strings if s.startswith("--")]
        if not longs:
            continue
        name = a.dest if a.dest != argparse.SUPPRESS else longs[0][2:].replace("-", "_")
        if name not in NOT_SETTINGS:
            names.add(name)
    return names


def _describe(p: argparse.ArgumentParser) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit, match=r"^\d+$") as done:
        p.parse_args(["--describe"])
    assert done.value.code == 0, f"--describe exited {done.value.code}"
    return out.getvalue()


def _doc_sections(command: str) -> str:
    """The text of docs/config.md's sections for ``halsift COMMAND`` (the command's and its extra classes')."""
    text = (ROOT / "docs" / "config.md").read_text()
    parts = re.split(r"(?m)^(?=### )", text)
    mine = [s for s in parts if re.match(rf"### `halsift {re.escape(command)}`(?: \(|[ \t]*\n)", s)]
    return "\n".join(mine)


@pytest.mark.parametrize("path, module", sorted(COMMANDS.items()), ids=[" ".join(k) for k in sorted(COMMANDS)])
def test_every_flag_is_described_and_documented(path, module):
    p = _parser(module)
    settings = _settings(p)
    assert settings, f"halsift {' '.join(path)} takes no settings?"
    described = {m.group(1) for m in re.finditer(r"(?m)^(\w+):", _describe(p))}
    missing = sorted(settings - described)
    assert not missing, f"halsift {' '.join(path)} --describe lacks {missing}"
    doc = _doc_sections(" ".join(path))
    undocumented = sorted(s for s in settings if f"`{s}`" not in doc)
    assert not undocumented, f"docs/config.md's `halsift {' '.join(path)}` sections lack {undocumented}"


def test_the_check_sees_a_flag_declared_outside_the_settings():
    """The check itself can fail: a flag added by hand beside the settings classes is reported."""
    p = _parser(COMMANDS[("score",)])
    p.add_argument("--hand-made", type=int, default=0)
    assert "hand_made" in _settings(p)
    assert "hand_made" not in {m.group(1) for m in re.finditer(r"(?m)^(\w+):", _describe(p))}


@pytest.mark.parametrize("path, module", sorted(COMMANDS.items()), ids=[" ".join(k) for k in sorted(COMMANDS)])
def test_no_argparse_escape_leaks_into_describe_or_help(path, module):
    """A help text is plain text: argparse's ``%%`` escape is added when the flag is built, never written in a
    field's help, so neither ``--describe`` (``halsift run --describe`` included) nor ``--help`` shows ``%%``."""
    p = _parser(module)
    described = _describe(p)
    assert "%%" not in described, f"halsift {' '.join(path)} --describe prints '%%'"
    assert "%%" not in p.format_help(), f"halsift {' '.join(path)} --help prints '%%'"


def test_no_argparse_escape_in_the_docs():
    leaks = [str(f.relative_to(ROOT)) for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
             if "%%" in f.read_text()]
    assert not leaks, f"'%%' (argparse's escape) in {leaks}"
