"""The config reference, generated from the config classes: ``python -m halsift.launch.config_reference >
docs/config.md`` (tests/launch/test_config_reference.py checks that the file is current).

Every setting a user can give is a field of one of these classes, with its type, default and one-line help: a
recipe's sections, the commands' flags (a command module, or a generated command, names its class ``CONFIG``), a
trained detector's options and the detector families' spec options.
"""

from __future__ import annotations

import dataclasses
import typing

import yaml

from halsift.corpus.config import field_default, to_dict
from halsift.launch.describe import type_text


def _default(f: dataclasses.Field) -> str:
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return "(required)"
    d = field_default(f)
    if isinstance(d, str) and type(d) is not str:  # a detector default given by a constant's name
        return str(d)
    val = yaml.safe_dump(to_dict(d), default_flow_style=True, width=10_000).strip()
    return val.removesuffix("...").strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _entry_class(tp: typing.Any) -> type | None:
    """The dataclass of a ``dict[str, Cls]`` field's entries, else None."""
    args = typing.get_args(tp) if typing.get_origin(tp) is dict else ()
    return args[1] if len(args) == 2 and dataclasses.is_dataclass(args[1]) else None


def tables(cls: type, title: str, key_prefix: str = "", drop: tuple[str, ...] = (), root: str = "") -> list[str]:
    """A markdown table of ``cls``'s own settings, then one per nested section (titled ``root: `section```)."""
    hints = typing.get_type_hints(cls)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        if not f.init or f.name in drop:
            continue
        tp, key = hints[f.name], f"{key_prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            nested.append((tp, f"`{key}`", f"{key}."))
            continue
        rng = f" in `{_cell(f.metadata['range'])}`" if f.metadata.get("range") else ""  # its declared range
        rows.append(f"| `{key}` | `{_cell(type_text(tp))}`{rng} | `{_cell(_default(f))}` | "
                    f"{_cell(f.metadata.get('help', ''))} |")
        entry = _entry_class(tp)
        if entry is not None:
            nested.append((entry, f"`{key}.NAME`", f"{key}.NAME."))
    out = [f"### {title}", ""]
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        out += [" ".join(cls.__doc__.split()), ""]
    if rows:
        out += ["| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for sub, sub_title, sub_prefix in nested:
        out += tables(sub, f"{root or title}: {sub_title}", sub_prefix, root=root or title)
    return out


def command_configs() -> list[tuple[str, type]]:
    """``(command, config class)`` of every command whose module (or generated command) names its class
    ``CONFIG``."""
    from halsift.launch.cli import commands

    return [(" ".join(path), mod.CONFIG) for path, mod in commands().items() if getattr(mod, "CONFIG", None)]


def reference() -> str:
    from halsift.filtering.detectors.spec import families, family_config
    from halsift.launch.recipe_config import Recipe
    from halsift.synth.world_judge_config import WorldJudgeSettings
    from halsift.training.detector_config import DetectorTrainConfig

    out = ["# Config reference", "",
           "Generated from the config classes by `python -m halsift.launch.config_reference > docs/config.md`; "
           "do not edit by hand. `halsift run --describe` and `halsift COMMAND --describe` print the same settings "
           "as commented YAML.", "",
           "Values are checked strictly (pydantic, `halsift.corpus.config`): an integer setting takes an integer "
           "(not `\"1\"`, `1.0` or `true`), a number an integer or a float, a switch only `true`/`false`, a text "
           "setting a string (quote a number: `bench_split: \"2017\"`). A type followed by an interval (`int` in "
           "`[1, inf)`; `(`/`)` open ends) is the setting's declared range, checked wherever the settings are built "
           "(flags, `--config`, recipes and `--dry-run`): NaN is in no range and an infinity only in one closed at "
           "it; a size range (`[16MB, RAM]`, RAM = this machine's memory) takes text such as `512MB` or `2GiB`. "
           "Unknown keys and bad values stop with one line naming the key.", "",
           "## Recipes (`halsift run RECIPE key=value ...`)", ""]
    out += tables(Recipe, "recipe")
    out += tables(DetectorTrainConfig, "recipe: `detectors.NAME.options` (kind `lora`)", "detectors.NAME.options.",
                  drop=("base", "bench", "out"))
    out += tables(WorldJudgeSettings, "recipe: `detectors.NAME.options` (kind `world_judge`)",
                  "detectors.NAME.options.")
    out += ["## Commands", "",
            "Each key is also a flag: `batch_size` is `--batch-size`; a switch `x` is `--x` / `--no-x`. "
            "`train clip` and `train detector` also read these keys from `--config YAML`.", ""]
    for name, cls in command_configs():
        out += tables(cls, f"`halsift {name}`")
    out += ["## Detector specs", "",
            "`FAMILY[:key=value,...]` (values read as YAML: `seed=0` is an integer, `weights=[1,2]` a list; a text "
            "option may be given a number) or a YAML file `{family: ..., key: value}`. Each family's options are "
            "its class's `__init__` keywords, with their types and defaults (read from the source by "
            "`filtering.spec.family_config`); the dry run checks every spec against them. Keys are read with "
            "spaces stripped, in lower case, `-` as `_`. `trust_remote_code` and `api_key_env` come only from your "
            "own spec (command line, your recipe's text), never from a file a detector loads (DESIGN.md, Trust).",
            ""]
    for name in families():
        out += tables(family_config(name), f"`{name}:`")
    return "\n".join(out)


if __name__ == "__main__":
    print(reference(), end="")
