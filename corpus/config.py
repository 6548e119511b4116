"""Typed configs from YAML: dataclasses whose field docs are the YAML comments; validation by pydantic.

Every field has a default and a one-line ``help`` in its metadata. Configs stay plain stdlib dataclasses (no
framework base class: any layer can declare one, and ``dataclasses.replace``/``asdict`` keep working);
:func:`from_dict` validates a mapping into one with pydantic v2's ``TypeAdapter`` (``extra='forbid'``, strict
mode). Library choice: pydantic validates stdlib dataclasses as they are, reports every error with its exact
location, is already a dependency (wandb) and imports without torch; jsonargparse/draccus would also own the
argument parser (ours keeps the flag names and one-line errors the commands promise) and omegaconf's structured
configs carry no strict scalar types (``"1"`` becomes 1).

Strictness (pydantic strict mode over the YAML's JSON types): an integer field takes only an integer (not
``"1"``, ``1.0`` or ``true``), a number field an integer or a float, a boolean only ``true``/``false``, a string
field only a string (quote a number: ``bench_split: "2017"``), a list only a list. Unknown keys, wrong types
and bad values are :class:`ConfigError` with one line naming the dotted key and what was expected; a config's
own ``validate()`` method (run after the types check, innermost first) adds value checks. ``key=value``
overrides (dotted paths, YAML-typed values) are applied before validation.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from halsift.corpus.errors import InputError
from halsift.corpus.ranges import parse_interval, range_problem
from halsift.corpus.safe_yaml import MAX_YAML_NODES, clip_text, safe_load_yaml, short_repr  # noqa: F401 (re-exported)

WandbMode = Literal["offline", "online", "disabled"]  # every wandb mode setting (commands, recipes, training)
T = TypeVar("T")


class ConfigError(InputError):
    """A recipe or config file has an unknown key, a wrong type or a bad value; the message names the key."""


def field(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING,
          cli: Mapping[str, Any] | None = None, range: str | None = None, **kw):
    """A dataclass field with a one-line ``help`` (used for YAML comments, ``--help`` and error messages), its
    ``range`` (an interval of :mod:`halsift.corpus.ranges`, e.g. ``"[1, inf)"``: checked wherever the config is
    built, shown by ``--help``, ``--describe`` and docs/config.md) and, for a command's config, how its flag is
    declared (``cli``: see :func:`add_dataclass_arguments`)."""
    if range is not None:
        parse_interval(range)  # a malformed declaration fails at import, not when a user gives a value
    meta = {"help": help, **({"cli": dict(cli)} if cli else {}), **({"range": range} if range else {}),
            **kw.pop("metadata", {})}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta, **kw)
    return dataclasses.field(default=default, metadata=meta, **kw)


def field_default(f: dataclasses.Field) -> Any:
    """The default value of dataclass field ``f`` (``None`` when it has none)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def fields_of(cls: type, name: str, drop: Sequence[str], doc: str, first: Sequence[str] = (),
              frozen: bool = False) -> type:
    """A new dataclass ``name`` holding the fields of ``cls`` except ``drop``: the same types, defaults and help,
    so that a section of a bigger config (a recipe's training sections) or the job a command's settings become
    reuses one set of field definitions. ``first``: fields moved to the front, in that order (a job's positional
    arguments); ``frozen``: a frozen dataclass. Subclass it to add fields or a ``validate()``."""
    hints = typing.get_type_hints(cls)
    unknown = sorted((set(drop) | set(first)) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise TypeError(f"fields_of({cls.__name__}): no field {unknown[0]!r}")
    kept = [(f.name, hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                     metadata=f.metadata))
            for f in dataclasses.fields(cls) if f.init and f.name not in drop]
    kept.sort(key=lambda f: first.index(f[0]) if f[0] in first else len(first))
    return dataclasses.make_dataclass(name, kept, namespace={"__doc__": doc, "__module__": cls.__module__},
                                      frozen=frozen)


# ------------------------------------------------------------------------------------------------ validation
_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true/false", "string": "a string", "list": "a list",
             "tuple": "a list", "dict": "a mapping", "dataclass": "a mapping", "path": "a path", "none": "null"}


@functools.cache
def _adapter(cls: type):
    """pydantic's validator for dataclass ``cls``; unknown keys are refused in it and every nested dataclass."""
    from pydantic import ConfigDict, TypeAdapter

    if "__pydantic_config__" not in vars(cls):
        cls.__pydantic_config__ = ConfigDict(extra="forbid", strict=True)  # read by pydantic for cls and below
    return TypeAdapter(cls)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _type_name(tp: Any) -> str:
    """``int``, ``list[int]``: how pydantic names a union member in an error's location."""
    if typing.get_origin(tp) is None and hasattr(tp, "__name__"):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _walk(tp: Any, loc: Sequence[str | int], prefix: str) -> tuple[str, Any, Any]:
    """pydantic's error location -> ``(dotted key, type at that key, the union whose member the location ends
    in, or None)``: pydantic names the union member it tried, which is not part of the key."""
    key, union = prefix, None
    for part in loc:
        union = None
        if _is_union(tp):
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            named = next((a for a in members if _type_name(a) == part), None)
            if named is not None or len(members) > 1:
                union, tp = tp, named if named is not None else Any
                continue
            tp = members[0]  # X | None: pydantic names no member
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if isinstance(part, int) and origin in (list, tuple, Sequence):
            key, tp = f"{key}[{part}]", args[0] if args else Any
            continue
        key = f"{key}.{part}" if key else str(part)
        if dataclasses.is_dataclass(tp):
            tp = typing.get_type_hints(tp).get(str(part), Any)
        elif origin in (dict, Mapping):
            tp = args[1] if len(args) == 2 else Any
        else:
            tp = Any
    return key, tp, union


def _message(cls: type, err: dict, prefix: str) -> str:
    """One pydantic error as halsift's one line: the dotted key, what was expected, what was given."""
    kind, loc, value = err["type"], err["loc"], err.get("input")
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        key, _, _ = _walk(cls, loc, prefix)
        _, owner, _ = _walk(cls, loc[:-1], prefix)
        if _is_union(owner):  # Cfg | None
            owner = next((a for a in typing.get_args(owner) if dataclasses.is_dataclass(a)), owner)
        known = sorted(f.name for f in dataclasses.fields(owner)) if dataclasses.is_dataclass(owner) else []
        renamed = getattr(owner, "RENAMED", {}).get(str(loc[-1]))  # a class's {old key: new key}
        if renamed:
            return f"{key}: renamed to '{key.rsplit('.', 1)[0] + '.' if '.' in key else ''}{renamed}'"
        return f"unknown key '{key}'" + (f" (known: {', '.join(known)})" if known else "")
    key, tp, union = _walk(cls, loc, prefix)
    where = key or "config"
    if union is not None:
        names = [_type_name(a) for a in typing.get_args(union) if a is not type(None)]
        return f"{where}: {short_repr(value)} matches none of {names}"
    if kind == "literal_error":
        return f"{where}: {short_repr(value)} is not one of {list(typing.get_args(tp)) or err['ctx']['expected']}"
    if kind in ("missing", "missing_argument"):
        return f"{where}: required"
    expected = "a path" if tp is Path else _EXPECTED.get(kind.split("_")[0])
    if expected:
        return f"{where}: expected {expected}, got {short_repr(value)}"
    return f"{where}: {err['msg'][:1].lower()}{err['msg'][1:]}, got {short_repr(value)}"


def from_dict(cls: type[T], data: Mapping[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping; unknown keys, bad types and bad values are :class:`ConfigError`
    naming the dotted key (under ``prefix``)."""
    from pydantic import ValidationError
    from pydantic_core import PydanticSerializationError, to_json

    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    try:  # validated as JSON: strict mode then takes a YAML string for a Path and a mapping for a dataclass
        obj = _adapter(cls).validate_json(to_json(data, inf_nan_mode="constants"), strict=True)
    except PydanticSerializationError as e:
        raise ConfigError(f"{prefix or 'config'}: {clip_text(str(e))}") from None
    except ValidationError as e:
        raise ConfigError(_message(cls, e.errors()[0], prefix)) from None
    _validate_tree(obj, prefix)
    return obj


def _validate_tree(obj: Any, prefix: str) -> None:
    """Run ``validate()`` of every dataclass in ``obj``, innermost first; a ``ValueError`` names its key."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _validate_tree(v, f"{prefix}.{k}" if prefix else str(k))
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _validate_tree(v, f"{prefix}[{i}]")
        return
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    for f in dataclasses.fields(obj):
        _validate_tree(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    check_ranges(obj, prefix)
    check = getattr(obj, "validate", None)
    if not callable(check):
        return
    try:
        check()
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(_qualify(type(obj), str(e), prefix)) from None


def check_ranges(obj: Any, prefix: str = "") -> None:
    """Each field of dataclass ``obj`` declared with a ``range`` holds a value in it (``None``: unset, not checked):
    a :class:`ConfigError` naming the dotted key otherwise. :func:`from_dict` runs it before ``validate()``."""
    for f in dataclasses.fields(obj):
        interval = f.metadata.get("range")
        problem = range_problem(getattr(obj, f.name), interval) if interval else None
        if problem:
            raise ConfigError(f"{prefix}.{f.name}: {problem}" if prefix else f"{f.name}: {problem}")


def _qualify(cls: type, msg: str, prefix: str) -> str:
    """A ``validate()`` message ("field: ..." or "a/b: ...") of the config at ``prefix``, named in full."""
    if not prefix or msg.startswith(prefix):
        return msg
    first = msg.split(":")[0]
    own = {f.name for f in dataclasses.fields(cls)}
    named = all(part.split(".")[0] in own for part in first.split("/"))
    return f"{prefix}.{msg}" if named else f"{prefix}: {msg}"


# ------------------------------------------------------------------------------------------------ YAML and overrides
def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[x, y]"]`` -> nested dict with YAML-typed values."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r}: expected key=value")
        key, raw = pair.split("=", 1)
        try:
            value = safe_load_yaml(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {key}: cannot parse {short_repr(raw)} ({clip_text(str(e))})") from None
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def deep_merge(base: dict, over: Mapping) -> dict:
    """Recursively merge ``over`` into a copy of ``base``."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def load_yaml(path: str | Path, empty_ok: bool = True) -> dict:
    """Read a YAML mapping; errors name the file. ``empty_ok=False``: an empty or ``null`` document is an error
    too (a recipe that says nothing must not run every default stage)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"recipe: {path} does not exist")
    try:
        data = safe_load_yaml(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({clip_text(str(e))})") from None
    if data is None:
        if not empty_ok:
            raise ConfigError(f"{path}: the file is empty (or null); expected a mapping of settings, e.g. the "
                              "shipped recipes (halsift run --list)")
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain dict (Paths as strings) for saving the resolved config."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def range_text(f: dataclasses.Field) -> str:
    """`` (in [1, inf))``: a field's declared range as ``--help`` and ``--describe`` show it ('' without one)."""
    return f" (in {f.metadata['range']})" if f.metadata.get("range") else ""


def describe(cls: type, indent: int = 0) -> str:
    """YAML with every field's default and its help as a comment (for docs and `--help`)."""
    lines = []
    pad = "  " * indent
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        help_ = f.metadata.get("help", "")
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"{pad}{f.name}:  # {help_}")
            lines.append(describe(tp, indent + 1))
            continue
        val = yaml.safe_dump(to_dict(field_default(f)), default_flow_style=True).strip()
        val = val.removesuffix("...").strip()
        lines.append(f"{pad}{f.name}: {val}  # {help_}{range_text(f)}")
        entry = typing.get_args(tp)[-1] if typing.get_origin(tp) is dict else None
        if entry is not None and dataclasses.is_dataclass(entry):  # show the shape of one entry, commented out
            lines.append(f"{pad}  # NAME:")
            lines += [f"{pad}  # {line}" for line in describe(entry, 1).splitlines()]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ command-line flags
def _flag_type(tp: Any) -> tuple[Any, list | None]:
    """The argparse ``type`` and ``choices`` of a field annotation (``X | None`` -> X; a Literal -> its values)."""
    if _is_union(tp):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = members[0] if len(members) == 1 else str
    if typing.get_origin(tp) is typing.Literal:
        values = list(typing.get_args(tp))
        return type(values[0]), values
    return tp, None


def add_dataclass_arguments(parser, cls: type, metavars: Mapping[str, str] | None = None, *,
                            config_file: bool = True, defaults: bool = False) -> None:
    """One ``--flag`` per field of ``cls`` (help = the field's help), plus ``--config YAML`` when ``config_file``.

    Lists take several values; booleans are on/off switches (``--x`` / ``--no-x``; a field named ``no_x`` is the
    switch ``--no-x``). A field's ``cli`` metadata (``field(..., cli={...})``) may say ``positional``,
    ``required``, ``metavar``, ``choices``, ``group`` (a titled argument group), ``exclusive`` (a mutually
    exclusive group's name; required when one of its fields is), ``const`` (an optional value: ``--x`` alone
    gives ``const``, ``--x V`` gives V) and, for a list, ``append`` (one value per flag, the flag repeated:
    ``--setup A --setup B``). Without ``defaults`` unset flags stay absent
    from the namespace, so :func:`config_from_args` overlays only what was given on the YAML; with it (commands
    without ``--config``) every field's default is in the namespace.
    """

    hints = typing.get_type_hints(cls)
    if config_file:
        parser.add_argument("--config", metavar="YAML", help=f"YAML with {cls.__name__} keys; flags override it")
    fields_ = [f for f in dataclasses.fields(cls) if f.init]
    groups: dict[str, Any] = {}
    for f in fields_:
        cli = f.metadata.get("cli", {})
        target = parser
        if cli.get("group"):
            target = groups.get(cli["group"]) or groups.setdefault(cli["group"], parser.add_argument_group(cli["group"]))
        if cli.get("exclusive"):
            name = "exclusive:" + cli["exclusive"]
            if name not in groups:
                required = any(g.metadata.get("cli", {}).get("exclusive") == cli["exclusive"]
                               and g.metadata.get("cli", {}).get("required") for g in fields_)
                groups[name] = target.add_mutually_exclusive_group(required=required)
            target = groups[name]
        _add_flag(target, f, hints[f.name], cli, (metavars or {}).get(f.name), defaults)


def _add_flag(target, f: dataclasses.Field, tp: Any, cli: Mapping[str, Any], metavar: str | None,
              defaults: bool) -> None:
    import argparse

    default = field_default(f)
    help_ = f.metadata["help"]
    if "default" not in help_ and not (default is None or default is False or default in ("", [])):
        help_ += f" (default: {default})"
    help_ += range_text(f)
    help_ = help_.replace("%", "%%")
    kw: dict[str, Any] = {"help": help_, "default": default if defaults else argparse.SUPPRESS}
    if cli.get("metavar") or metavar:
        kw["metavar"] = cli.get("metavar") or metavar
    if "const" in cli:  # a flag whose value may be left out: `--wandb` is `--wandb offline`
        kw.update(nargs="?", const=cli["const"])
    if cli.get("positional"):
        names = [f.name]
    else:
        names = ["--" + f.name.replace("_", "-")]
        kw["dest"] = f.name
        if cli.get("required") and not cli.get("exclusive"):
            kw["required"] = True
    if tp is bool:
        kw.pop("metavar", None)
        action = "store_true" if f.name.startswith("no_") else argparse.BooleanOptionalAction
        target.add_argument(*names, action=action, **kw)
        return
    nargs = None
    if typing.get_origin(tp) is list and cli.get("append"):  # one value per flag, the flag repeated
        tp, kw["action"] = (typing.get_args(tp) or (str,))[0], "append"
    elif typing.get_origin(tp) is list:
        nargs, tp = "+", (typing.get_args(tp) or (str,))[0]
        if not (defaults and default):  # a repeated list flag adds up (`--scores A --scores B`); never onto a default
            kw["action"] = "extend"
    tp, choices = _flag_type(tp)
    choices = list(cli["choices"]) if cli.get("choices") else choices
    if nargs is not None:
        kw["nargs"] = nargs
    if "nargs" in cli:  # e.g. an optional positional ("?"), or any number of words ("*")
        kw["nargs"] = cli["nargs"]
        if cli.get("positional"):
            kw.pop("action", None)
    target.add_argument(*names, type=tp, choices=choices, **kw)


def config_from_args(cls: type[T], args) -> T:
    """``--config`` YAML overlaid with the flags given -> validated ``cls``; errors name the ``--flag``."""
    data = load_yaml(args.config) if getattr(args, "config", None) else {}
    positional = []
    for f in dataclasses.fields(cls):
        if hasattr(args, f.name):
            data[f.name] = getattr(args, f.name)
        if f.metadata.get("cli", {}).get("positional"):
            positional.append(f.name)
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        raise ConfigError(flag_message(str(e), positional)) from None


def flag_message(msg: str, positional: Sequence[str] = ()) -> str:
    """``"batch_size: must be >= 1"`` -> ``"--batch-size: must be >= 1"`` (config field named as its CLI flag;
    a ``positional`` argument as its metavar, ``PATH``)."""
    field_ = msg.split(":", 1)[0]
    if field_ in positional:
        return field_.upper() + msg[len(field_):]
    if field_.isidentifier():
        return "--" + field_.replace("_", "-") + msg[len(field_):]
    return msg


# ------------------------------------------------------------------------------------------------ wandb flags
_WANDB_G = {"group": "logging"}
WandbFlag = Literal["offline", "online"]  # `--wandb [MODE]` of score and select (a command logs only when asked)


def wandb_mode_field():
    """The ``--wandb [MODE]`` setting, for a command's settings class (a new field each call)."""
    return field(None, help="log this run's throughput, skipped counts and (select) kept fraction to wandb: offline "
                            "(what `--wandb` alone means; `wandb sync` later) or online",
                 cli={**_WANDB_G, "metavar": "MODE", "const": "offline"})


def wandb_project_field():
    """The ``--wandb-project`` setting, for a command's settings class (a new field each call)."""
    return field("halsift", help="wandb project", cli=_WANDB_G)
