"""Typed configs from YAML: dataclasses whose field docs are the YAML comments; validation in one place.

Every field has a default and a one-line ``help`` in its metadata. Unknown keys, wrong types and bad values
are :class:`ConfigError` naming the dotted key. ``key=value`` overrides (dotted paths, YAML-typed values) are
applied before validation.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from halsift.corpus.errors import InputError
from halsift.corpus.safe_yaml import MAX_YAML_NODES, clip_text, safe_load_yaml, short_repr  # noqa: F401 (re-exported)

T = TypeVar("T")


class ConfigError(InputError):
    """A recipe or config file has an unknown key, a wrong type or a bad value; the message names the key."""


def field(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING, **kw):
    """A dataclass field with a one-line ``help`` (used for YAML comments and error messages)."""
    meta = {"help": help, **kw.pop("metadata", {})}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta, **kw)
    return dataclasses.field(default=default, metadata=meta, **kw)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert ``value`` to annotation ``tp``; raises ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {short_repr(value)} matches none of "
                          f"{[_type_name(a) for a in args]}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: {short_repr(value)} is not one of {list(args)}")
        return value
    if origin in (list, Sequence, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {short_repr(value)}")
        inner = args[0] if args else Any
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {short_repr(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {short_repr(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {short_repr(value)}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {short_repr(value)}")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise ConfigError(f"{key}: expected a path, got {short_repr(value)}")
    return value


def from_dict(cls: type[T], data: Mapping[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping; unknown keys and bad types are errors naming the key."""
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(f"unknown key '{where}{unknown[0]}' (known: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(value, hints[name], f"{prefix}.{name}" if prefix else name)
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if callable(check):
        try:
            check()
        except ConfigError:
            raise
        except ValueError as e:
            msg = str(e)
            if not prefix or msg.startswith(prefix):
                raise ConfigError(msg) from None
            first = msg.split(":")[0]  # "field: ..." or "a/b: ..." names fields of this config: qualify them
            own = {f.name for f in dataclasses.fields(cls)}
            named = all(part.split(".")[0] in own for part in first.split("/"))
            raise ConfigError(f"{prefix}.{msg}" if named else f"{prefix}: {msg}") from None
    return obj


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


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping; errors name the file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"recipe: {path} does not exist")
    try:
        data = safe_load_yaml(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({clip_text(str(e))})") from None
    if data is None:
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
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        val = yaml.safe_dump(to_dict(default), default_flow_style=True).strip()
        if val.endswith("\n..."):
            val = val[:-4].strip()
        val = val.removesuffix("...").strip()
        lines.append(f"{pad}{f.name}: {val}  # {help_}")
        entry = typing.get_args(tp)[-1] if typing.get_origin(tp) is dict else None
        if entry is not None and dataclasses.is_dataclass(entry):  # show the shape of one entry, commented out
            lines.append(f"{pad}  # NAME:")
            lines += [f"{pad}  # {line}" for line in describe(entry, 1).splitlines()]
    return "\n".join(lines)


def add_dataclass_arguments(parser, cls: type, metavars: Mapping[str, str] | None = None) -> None:
    """One ``--flag`` per field of ``cls`` (help = the field's help) plus ``--config YAML``.

    Lists take several values; booleans are on/off switches (``--x`` / ``--no-x``). Unset flags stay absent
    from the namespace, so :func:`config_from_args` can overlay only what was given on the YAML.
    """
    import argparse

    hints = typing.get_type_hints(cls)
    parser.add_argument("--config", metavar="YAML", help=f"YAML with {cls.__name__} keys; flags override it")
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kw = dict(dest=f.name, default=argparse.SUPPRESS, help=f"{f.metadata['help']} (default: {default!r})")
        metavar = (metavars or {}).get(f.name)
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif typing.get_origin(tp) is list:
            parser.add_argument(flag, nargs="+", type=typing.get_args(tp)[0], metavar=metavar, **kw)
        else:
            parser.add_argument(flag, type=tp, metavar=metavar, **kw)


def config_from_args(cls: type[T], args) -> T:
    """``--config`` YAML overlaid with the flags given -> validated ``cls``; errors name the ``--flag``."""
    data = load_yaml(args.config) if getattr(args, "config", None) else {}
    for f in dataclasses.fields(cls):
        if hasattr(args, f.name):
            data[f.name] = getattr(args, f.name)
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        raise ConfigError(flag_message(str(e))) from None


def flag_message(msg: str) -> str:
    """``"batch_size: must be >= 1"`` -> ``"--batch-size: must be >= 1"`` (config field named as its CLI flag)."""
    field_ = msg.split(":", 1)[0]
    if field_.isidentifier():
        return "--" + field_.replace("_", "-") + msg[len(field_):]
    return msg
