"""``--describe``: a command's settings as commented YAML, read from its config class (the same fields its flags,
``--config`` files and recipes use), with the detector families' options where a command takes a detector spec."""

from __future__ import annotations

import argparse


def describe_detectors() -> str:
    """Every registered detector family with its typed options (the keys a ``family:key=value,...`` spec takes) and
    their declared ranges (``budget: float in (0, 1] = 0.25``)."""
    import dataclasses

    from halsift.filtering.detectors.spec import families, family_config

    lines = ["# detector specs: FAMILY[:key=value,...] or a YAML file {family: ..., key: value}; families and options:"]
    for name in families():
        opts = []
        for f in dataclasses.fields(family_config(name)):
            tp = type_text(f.type) + (f" in {f.metadata['range']}" if f.metadata.get("range") else "")
            opts.append(f"{f.name}: {tp} (required)" if f.default is dataclasses.MISSING
                        else f"{f.name}: {tp} = {f.default!r}")
        lines.append(f"#   {name}: {', '.join(opts) or '(no options)'}")
    return "\n".join(lines)


def type_text(tp) -> str:
    """A type as a reader writes it: ``int``, ``list[float] | None`` (no module paths)."""
    import re
    import typing

    if typing.get_origin(tp) is None and hasattr(tp, "__name__"):
        return tp.__name__
    return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", str(tp)).replace("NoneType", "None")


def describe_command(cls: type, detectors: bool = False, more: tuple[type, ...] = ()) -> str:
    """``cls``'s fields as YAML (default and help of each), then those of ``more`` (the command's other settings
    classes, e.g. its scale-out and logging flags), then the detector families when ``detectors``."""
    from halsift.corpus.config import describe

    parts = [describe(cls)]
    for extra in more:
        doc = " ".join((extra.__doc__ or extra.__name__).split())
        parts += [f"# {doc}", describe(extra)]
    text = "\n".join(parts)
    return f"{text}\n{describe_detectors()}" if detectors else text


class _Describe(argparse.Action):
    def __init__(self, option_strings, dest, cls: type, detectors: bool, more: tuple[type, ...] = (), **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)
        self.cls, self.detectors, self.more = cls, detectors, more

    def __call__(self, parser, namespace, values, option_string=None):
        cls = self.cls
        if isinstance(cls, str):  # "module:Class", imported only when asked for (keeps `--help` instant)
            import importlib

            module, name = cls.split(":")
            cls = getattr(importlib.import_module(module), name)
        print(describe_command(cls, self.detectors, self.more))
        parser.exit(0)


def add_describe_argument(parser: argparse.ArgumentParser, cls: type | str, detectors: bool = False,
                          more: tuple[type, ...] = ()) -> None:
    """``--describe``: print the settings of ``cls`` and ``more`` (and the detector families' options) and exit,
    like ``--help``."""
    parser.add_argument("--describe", action=_Describe, cls=cls, detectors=detectors, more=more,
                        help="print every setting with its default and meaning" +
                             (", and every detector family's options" if detectors else "") + ", then exit")


def config_arguments(cls: type, metavars: dict[str, str] | None = None, detectors: bool = False, *,
                     config_file: bool = True, defaults: bool = False):
    """``add_arguments`` of a command whose flags are ``cls``'s fields: one flag per field, ``--config YAML`` (unless
    not ``config_file``) and ``--describe`` (:func:`halsift.corpus.config.add_dataclass_arguments`)."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from halsift.corpus.config import add_dataclass_arguments

        add_dataclass_arguments(parser, cls, metavars, config_file=config_file, defaults=defaults)
        add_describe_argument(parser, cls, detectors=detectors)

    return add_arguments


def parsed_config(cls: type, args: argparse.Namespace, check=None):
    """``--config`` YAML overlaid with the flags given -> validated ``cls`` (then ``check(cfg)``); a bad value is a
    one-line usage error naming its flag."""
    from halsift.corpus.config import ConfigError, config_from_args, flag_message
    from halsift.launch.cli import UsageError

    try:
        cfg = config_from_args(cls, args)
        if check is not None:
            check(cfg)
    except (ConfigError, ValueError) as e:
        raise UsageError(flag_message(str(e))) from None
    return cfg


def add_format_command_arguments(parser: argparse.ArgumentParser, cls: type, formats: dict[str, tuple[str, str]],
                                 width: int = 15) -> None:
    """A ``FORMAT SRC --out OUT`` command's flags from ``cls`` (``convert``, ``export``), ``--describe``, and an
    epilog listing each format's SRC and OUT."""
    from halsift.corpus.config import add_dataclass_arguments

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "formats:\n" + "\n".join(f"  {k:<{width}} SRC = {v[0]}; OUT = {v[1]}" for k, v in formats.items())
    add_dataclass_arguments(parser, cls, config_file=False, defaults=True)
    add_describe_argument(parser, cls)
