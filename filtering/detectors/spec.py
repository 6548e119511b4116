"""Detector specs: a short string or a YAML file naming a detector family and its options.

Short form ``family[:key=value,key=value,...]``, e.g.::

    clip:arch=ViT-B-32,pretrained=openai
    clip:arch=halsift-tiny,checkpoint=/runs/clip/model.safetensors
    random:seed=0
    oracle
    ensemble:members=[clip:arch=halsift-tiny,pretrained=random,random:seed=1],weights=[0.7,0.3],norm=rank
    lora:/runs/det/adapter                       (= lora:path=/runs/det/adapter; `halsift train detector` output)

Values are read as YAML scalars/lists (``seed=0`` is an int, ``weights=[1,2]`` a list); option keys are
normalized (:func:`normalize_key`: ``Trust-Remote-Code `` is ``trust_remote_code``). Inside ``members=[...]``
the member specs are separated by ``;`` or by commas (a piece whose text before its first ``=`` holds a ``:``,
or that has no ``=`` at all, starts a new member). A YAML file holds the same fields::

    family: ensemble
    members: ["clip:arch=halsift-tiny,pretrained=random", {family: random, seed: 1}]
    weights: [0.7, 0.3]
    norm: zscore

Families are registered by name -> ``"module:Class"`` (imported lazily); a later issue adds its own with
:func:`register_family`. Each class's ``__init__`` keyword arguments are its options: unknown keys are errors.
Every detector's options pass :func:`_options` (normalized, checked, then :mod:`~halsift.filtering.detectors.trust`'s rule:
``trust_remote_code`` and ``api_key_env`` only from the user's own spec, never from a file a detector loads).
"""

from __future__ import annotations

import ast
import contextvars
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from halsift.corpus.ranges import in_interval  # noqa: F401 (re-exported: the one interval parser lives in corpus)
from halsift.corpus.safe_yaml import safe_load_yaml, short_repr
from halsift.filtering.detectors import trust
from halsift.filtering.detectors.base import Detector
from halsift.filtering.detectors.spec_error import SpecError




_REGISTRY: dict[str, str | type] = {
    "clip": "halsift.filtering.detectors.clip:ClipDetector",
    "random": "halsift.filtering.detectors.baselines:RandomDetector",
    "oracle": "halsift.filtering.detectors.baselines:OracleDetector",
    "ensemble": "halsift.filtering.detectors.ensemble:EnsembleDetector",
    "vlm": "halsift.filtering.detectors.vlm:VlmDetector",
    "api": "halsift.filtering.detectors.api:ApiDetector",
    "lora": "halsift.filtering.detectors.lora:LoraDetector",
    "vllm": "halsift.filtering.detectors.vllm_judge:VllmDetector",
    "cascade": "halsift.filtering.detectors.cascade:CascadeDetector",
    "subset": "halsift.filtering.detectors.cascade:SubsetDetector",
    "student": "halsift.filtering.detectors.student:StudentDetector",
}
# options that are themselves a detector spec, kept as text (``cheap=[clip:arch=X,checkpoint=Y]``: the brackets
# are dropped); walked like ensemble members by :func:`iter_specs`
_NESTED = {"cascade": ("cheap", "judge"), "subset": ("detector",)}
# families whose first option may be given without its key: ``lora:DIR`` == ``lora:path=DIR``
_POSITIONAL = {"lora": "path"}


def register_family(name: str, target: str | type) -> None:
    """Register detector family ``name`` as a class or a lazy ``"module:Class"`` path."""
    _REGISTRY[name] = target


def families() -> list[str]:
    return sorted(_REGISTRY)


def _family_class(name: str, spec: str) -> type:
    if name not in _REGISTRY:
        raise SpecError(f"detector spec {spec!r}: unknown family {name!r}, expected one of {families()}")
    target = _REGISTRY[name]
    if isinstance(target, str):
        mod, cls = target.split(":")
        target = getattr(importlib.import_module(mod), cls)
        _REGISTRY[name] = target
    return target


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
            if depth < 0:
                raise SpecError(f"unbalanced brackets in {text!r}")
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SpecError(f"unbalanced brackets in {text!r}")
    out.append("".join(cur))
    return out


def _split_members(text: str) -> list[str]:
    """``[a:x=1,y=2,b,c:z=3]`` -> ``["a:x=1,y=2", "b", "c:z=3"]`` (``;`` also separates)."""
    inner = text.strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        raise SpecError(f"members={text!r}: expected a bracketed list like [clip:arch=ViT-B-32,random:seed=0]")
    members: list[str] = []
    for chunk in _split_top(inner[1:-1], ";"):
        for piece in _split_top(chunk, ","):
            piece = piece.strip()
            if not piece:
                continue
            head = piece.split("=", 1)[0]
            if members and "=" in piece and ":" not in head:
                members[-1] += "," + piece
            else:
                members.append(piece)
    return members


def normalize_key(key: Any, where: str) -> str:
    """An option key as every rule sees it: surrounding spaces stripped, lower case, ``-`` read as ``_``
    (``' Trust-Remote-Code'`` is ``trust_remote_code``). A key that is not text is an error."""
    if not isinstance(key, str):
        raise SpecError(f"detector spec {where!r}: option key {key!r} is not text")
    return key.strip().lower().replace("-", "_")


def normalize_options(pairs: Iterable[tuple[Any, Any]], where: str) -> dict[str, Any]:
    """``(key, value)`` pairs -> options with normalized keys; two spellings of one key are an error."""
    opts: dict[str, Any] = {}
    for k, v in pairs:
        key = normalize_key(k, where)
        if key in opts:
            raise SpecError(f"detector spec {where!r}: option {key!r} given twice")
        opts[key] = v
    return opts


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Parse a short spec string into ``(family, options)``."""
    spec = spec.strip()
    if not spec:
        raise SpecError("detector spec is empty; expected e.g. 'clip:arch=ViT-B-32,pretrained=openai'")
    family, _, rest = spec.partition(":")
    family = family.strip()
    opts: dict[str, Any] = {}
    pieces = _split_top(rest) if rest.strip() else []
    if family in _POSITIONAL and pieces and "=" not in pieces[0]:
        opts[_POSITIONAL[family]] = pieces.pop(0).strip()
    for piece in pieces:
        if not piece.strip():
            continue
        if "=" not in piece:
            raise SpecError(f"detector spec {spec!r}: option {piece!r} is not key=value")
        k, v = piece.split("=", 1)
        k, v = normalize_key(k, spec), v.strip()
        if k in opts:
            raise SpecError(f"detector spec {spec!r}: option {k!r} given twice")
        if k == "members":
            opts[k] = _split_members(v)
        elif k in _NESTED.get(family, ()):
            opts[k] = v[1:-1].strip() if v.startswith("[") and v.endswith("]") else v
        else:
            try:
                opts[k] = yaml.safe_load(v) if v else ""
            except yaml.YAMLError as e:
                raise SpecError(f"detector spec {spec!r}: option {k}={v!r} is not a valid value ({e})") from e
    return family, opts


def format_spec(family: str, opts: dict[str, Any]) -> str:
    """Canonical spec string (options sorted, ``None`` dropped), used to compare runs."""
    parts = []
    for k in sorted(opts):
        v = opts[k]
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            v = "[" + ",".join(str(x) for x in v) + "]"
        elif isinstance(v, bool):
            v = str(v).lower()
        parts.append(f"{k}={v}")
    return family + (":" + ",".join(parts) if parts else "")


# annotation text -> type, for the option types read from a detector's source (anything else is not checked)
_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "Sequence": list, "list": list,
                          "Sequence[float]": list[float], "list[float]": list[float], "Sequence[str]": list[str],
                          "list[str]": list[str]}


def _option_type(annotation: str | None) -> Any:
    """``"int | None"`` -> ``int | None``; an annotation outside :data:`_TYPES` -> ``Any``."""
    if not annotation:
        return Any
    parts = [s.strip() for s in annotation.split("|")]
    kinds = [_TYPES.get(s) for s in parts if s != "None"]
    if not kinds or any(k is None for k in kinds):
        return Any
    tp = kinds[0]
    for k in kinds[1:]:
        tp = tp | k
    return tp | None if "None" in parts else tp


class _Named(str):
    """A default given by a constant's name in the source: shown as the name (never validated: it is not a
    user's value)."""

    def __repr__(self) -> str:
        return str(self)


def _source_signature(target: str) -> list[tuple[str, str | None, Any, str]] | None:
    """``(name, annotation, default, help)`` of each ``__init__`` keyword of a lazily registered ``"module:Class"``,
    read from its source without importing it; ``default`` is ``inspect.Parameter.empty`` for a required option and
    a :class:`_Named` where it is a constant's name; ``help`` comes from the class's ``OPTION_HELP`` mapping. None
    when the class is not found there or takes ``**kwargs``."""
    mod, cls = target.split(":")
    found = importlib.util.find_spec(mod)
    if found is None or not (found.origin or "").endswith(".py"):
        return None
    for node in ast.parse(Path(found.origin).read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is None or init.args.kwarg is not None:
                return None
            helps = next((ast.literal_eval(s.value) for s in node.body if isinstance(s, ast.Assign)
                          and [getattr(x, "id", "") for x in s.targets] == ["OPTION_HELP"]), {})
            a = init.args
            positional = [*a.posonlyargs, *a.args]
            defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + list(a.defaults)
            defaults += [inspect.Parameter.empty if d is None else d for d in a.kw_defaults]
            out = []
            for arg, d in zip([*positional, *a.kwonlyargs], defaults):
                if arg.arg in ("self", "spec"):
                    continue
                if d is not inspect.Parameter.empty:
                    try:
                        d = ast.literal_eval(d)
                    except ValueError:
                        d = _Named(ast.unparse(d))  # a named constant (e.g. DEFAULT_MAX_PIXELS), shown by name
                out.append((arg.arg, ast.unparse(arg.annotation) if arg.annotation else None, d,
                            helps.get(arg.arg, "")))
            return out
    return None


def _class_signature(cls: type) -> list[tuple[str, str | None, Any, str]]:
    params = inspect.signature(cls.__init__).parameters
    helps = getattr(cls, "OPTION_HELP", {})
    return [(n, p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", None),
             p.default, helps.get(n, "")) for n, p in params.items()
            if n not in ("self", "spec") and p.kind is not inspect.Parameter.VAR_KEYWORD]


_CONFIGS: dict[tuple[str, str], type] = {}


def family_config(family: str) -> type:
    """The typed options of a detector family as a dataclass (``<Family>Options``): one field per ``__init__``
    keyword, with its type and default, read from the class's source without importing it. A spec string is
    shorthand for it; the dry run validates a spec's options through it (:func:`check_spec`) and ``--describe`` /
    docs/config.md list it."""
    target = _REGISTRY[family]  # "module:Class", or the class once it was imported
    where = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
    key = (family, where)
    if key in _CONFIGS:
        return _CONFIGS[key]
    sig = _source_signature(where)  # the same reading whether or not the class was imported
    if sig is None:
        sig = _class_signature(_family_class(family, family))
    ranges = option_ranges(family)
    meta = {n: {"help": h, **({"range": ranges[n]} if n in ranges else {})} for n, _, _, h in sig}
    required = [(n, _option_type(a), dataclasses.field(metadata=meta[n]))
                for n, a, d, h in sig if d is inspect.Parameter.empty]
    optional = [(n, _option_type(a), dataclasses.field(default=d, metadata=meta[n]))
                for n, a, d, h in sig if d is not inspect.Parameter.empty]
    name = "".join(w.capitalize() for w in re.split(r"[^A-Za-z0-9]+", family)) + "Options"
    _CONFIGS[key] = dataclasses.make_dataclass(name, [*required, *optional])
    return _CONFIGS[key]


def _check_types(family: str, opts: dict[str, Any], where: str) -> None:
    """Each option's value against its type in :func:`family_config` (a text option may be given a number:
    ``model=2017`` is the text ``"2017"``); a missing required option is an error too."""
    import typing

    from halsift.corpus.config import ConfigError, from_dict

    cfg = family_config(family)
    hints = typing.get_type_hints(cfg)
    values = {}
    for k, v in opts.items():
        texty = str in (typing.get_args(hints.get(k)) or (hints.get(k),))
        values[k] = str(v) if texty and isinstance(v, (int, float)) and not isinstance(v, bool) else v
    missing = [f.name for f in dataclasses.fields(cfg) if f.default is dataclasses.MISSING and f.name not in values]
    if missing:
        raise SpecError(f"detector spec {where!r}: missing option {missing[0]!r} for family {family!r}")
    try:
        from_dict(cfg, values)  # types, then the ranges declared in OPTION_RANGES (the fields' ``range``)
    except ConfigError as e:
        raise SpecError(f"detector spec {where!r}: {e}") from None


@functools.lru_cache(maxsize=None)
def _source_constants(target: str) -> dict[str, Any] | None:
    """The literal class-level constants of ``"module:Class"`` read from its source (parsed once); None without one."""
    mod, cls = target.split(":")
    found = importlib.util.find_spec(mod)
    if found is None or not (found.origin or "").endswith(".py"):
        return None
    out: dict[str, Any] = {}
    for node in ast.parse(Path(found.origin).read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for s in node.body:
                targets = [s.target] if isinstance(s, ast.AnnAssign) else getattr(s, "targets", [])
                names = [getattr(x, "id", "") for x in targets]
                if len(names) == 1 and getattr(s, "value", None) is not None:
                    try:
                        out[names[0]] = ast.literal_eval(s.value)
                    except (ValueError, TypeError, SyntaxError):
                        continue  # not a literal (a call, a name): not a declaration this module reads
    return out


def family_constant(family: str, name: str, default: Any = None) -> Any:
    """A constant the family's class declares (``OPTION_RANGES = {...}``, ``staged = True``, ``CALLS_JUDGE = True``),
    read from its source without importing it (like the options), else from the class once it is imported;
    ``default`` when absent. Inherited values are seen only on an imported class."""
    target = _REGISTRY[family]
    if not isinstance(target, str):
        return getattr(target, name, default)
    constants = _source_constants(target)
    if constants is None:  # no Python source to read
        return getattr(_family_class(family, family), name, default)
    return constants.get(name, default)


def missing_files(spec: Any) -> list[tuple[str, str, str]]:
    """``(where, option, path)`` of every local file or folder a spec names (its families' ``FILE_OPTIONS``, at any
    depth of the tree) that does not exist: what a stage refuses before any work, rather than after a pass."""
    gone = []
    for where, family, opts in iter_specs(spec):
        for opt in family_constant(family, "FILE_OPTIONS", ()):
            value = opts.get(opt)
            if value and not Path(str(value)).exists():
                gone.append((where, opt, str(value)))
    return gone


def option_ranges(family: str) -> dict[str, str]:
    """The family's ``OPTION_RANGES`` (option -> interval such as ``"(0, 1]"`` or ``"[1, inf)"``), declared once
    on its class beside ``OPTION_HELP`` (:func:`family_constant`): the dry run and the build check the same ranges."""
    return dict(family_constant(family, "OPTION_RANGES", {}))


def family_staged(family: str) -> bool:
    """Whether the family's detectors run as a staged job over the whole corpus (capability ``staged``: its class
    declares ``staged = True``; the cascade), so that a spec may hold one only at its top."""
    return bool(family_constant(family, "staged", False))


def _family_options(family: str, where: str) -> list[str]:
    if family not in _REGISTRY:
        raise SpecError(f"detector spec {where!r}: unknown family {family!r}, expected one of {families()}")
    return [f.name for f in dataclasses.fields(family_config(family))]


def _check_keys(family: str, opts: dict[str, Any], allowed: list[str], where: str) -> None:
    bad = [k for k in opts if k not in allowed]
    if bad:
        raise SpecError(f"detector spec {where!r}: unknown option {bad[0]!r} for family {family!r}; "
                        f"expected one of {allowed}")


def _options(family: str, opts: dict[str, Any], where: str) -> dict[str, Any]:
    """The options a family's detector is built with: keys normalized, each one the family takes, then the trust
    rule (:func:`halsift.filtering.detectors.trust.apply`). Every build (:func:`_build`) and every dry-run check
    (:func:`iter_specs`) goes through here."""
    opts = normalize_options(opts.items(), where)
    allowed = _family_options(family, where)
    _check_keys(family, opts, allowed, where)
    return trust.apply(opts, allowed)


def _is_spec_file(text: str) -> bool:
    return text.endswith((".yaml", ".yml")) or (os.path.isfile(text) and ":" not in Path(text).name)


def _read_spec_file(path: Path) -> dict[str, Any]:
    """A YAML spec file's mapping (keys normalized); errors name the file."""
    if not path.exists():
        raise FileNotFoundError(f"detector spec: {path} does not exist")
    try:
        data = safe_load_yaml(path.read_text())  # alias expansion capped
    except yaml.YAMLError as e:
        raise SpecError(f"detector spec {path}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise SpecError(f"detector spec {path}: expected a mapping with 'family' and options")
    data = normalize_options(data.items(), str(path))
    if "family" not in data and "detector" not in data:
        raise SpecError(f"detector spec {path}: field 'family' is missing (expected one of {families()})")
    return data


def _split_family(spec: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """``(family, options, where)`` of a dict spec (``family`` or ``detector`` names the family)."""
    where = short_repr(spec)
    opts = normalize_options(spec.items(), where)
    family = opts.pop("family", None) or opts.pop("detector", None)
    if not isinstance(family, str):
        raise SpecError(f"detector spec {where}: field 'family' is missing (expected e.g. 'clip')")
    return family, opts, where


def iter_specs(spec: str | os.PathLike | dict) -> list[tuple[str, str, dict[str, Any]]]:
    """``(where, family, options)`` of a spec and, depth first, of every ensemble member, with the options a build
    would pass (:func:`_options`: normalized, checked, the trust rule applied). YAML spec files, the spec's or a
    member's, are read as files a detector loads; adapter folders (``lora:DIR``) are not opened."""
    return [node[1:] for node in spec_tree(spec)]


def spec_tree(spec: str | os.PathLike | dict) -> list[tuple[str, str, str, dict[str, Any]]]:
    """:func:`iter_specs`' nodes with their place in the tree first: ``""`` for the spec itself, then e.g.
    ``members[1]``, ``cheap``, ``judge.members[0]``."""
    out: list[tuple[str, str, str, dict[str, Any]]] = []
    _walk(spec, out, "")
    return out


def _walk(spec: str | os.PathLike | dict, out: list, path: str) -> None:
    if isinstance(spec, dict):
        family, opts, where = _split_family(spec)
    else:
        text = os.fspath(spec)
        if _is_spec_file(text):
            data = _read_spec_file(Path(text))
            with trust.from_file(text):
                _walk(data, out, path)
            return
        (family, opts), where = parse_spec(text), text
    opts = _options(family, opts, where)
    out.append((path, where, family, opts))
    below = f"{path}." if path else ""
    members = opts.get("members")
    for i, member in enumerate(members if isinstance(members, list) else []):
        _walk(member, out, f"{below}members[{i}]")
    for key in _NESTED.get(family, ()):
        if isinstance(opts.get(key), (str, dict)) and opts[key]:
            _walk(opts[key], out, below + key)


def check_tree(nodes: list[tuple[str, str, str, dict[str, Any]]]) -> None:
    """The rules a spec obeys as a tree (:func:`spec_tree`'s nodes): a family that runs as a staged job
    (:func:`family_staged`: the cascade) only at the top, never as an ensemble member, a cascade's cheap stage or
    judge, or below any of them. One line naming the spec and the place."""
    top = nodes[0][1] if nodes else ""
    for path, _, family, _ in nodes:
        if path and family_staged(family):
            raise _staged_inside(top, path, family)


def _staged_inside(top: str, place: str, family: str) -> SpecError:
    return SpecError(f"detector spec {top!r}: {place} is a {family} spec, which runs as a staged job over the whole "
                     f"corpus (halsift score --detector {family}:...): it can only be the whole spec, not a part of "
                     "one")


# the spec whose detector is being built (its members, adapter base, subset inner are built inside it): a staged
# family built there is refused whatever the path (an adapter's detector.yaml base is not walked by spec_tree)
_BUILDING: contextvars.ContextVar[str] = contextvars.ContextVar("halsift_spec_building", default="")


def check_spec(spec: str | os.PathLike | dict) -> list[tuple[str, str, dict[str, Any]]]:
    """Validate a spec without building the detector or importing heavy libraries: the family exists, every option
    (ensemble members' and spec files' too) is one its class takes, with a value of its type, no required option is
    missing, the trust rule holds, and the tree's rules (:func:`check_tree`: a staged family only at the top).
    Raises :class:`SpecError`; returns :func:`iter_specs`'s list."""
    tree = spec_tree(spec)
    check_tree(tree)
    for _, where, family, opts in tree:
        _check_types(family, opts, where)
    return [node[1:] for node in tree]


def _build(family: str, opts: dict[str, Any], where: str) -> Detector:
    cls = _family_class(family, where)
    outer = _BUILDING.get()
    if outer and family_staged(family):
        raise _staged_inside(outer, repr(where), family)
    opts = _options(family, opts, where)
    _check_types(family, opts, where)  # the same typed options the dry run checks (family_config)
    token = _BUILDING.set(where)
    try:
        det = cls(**opts)
    except SpecError:
        raise
    except (TypeError, ValueError) as e:
        raise SpecError(f"detector spec {where!r}: {e}") from e
    finally:
        _BUILDING.reset(token)
    canon = dict(opts)
    if "members" in canon and hasattr(det, "members"):  # members by their canonical specs, ';'-separated
        canon["members"] = "[" + ";".join(m.spec for m in det.members) + "]"
    det.spec = format_spec(family, canon)
    return det


def load_detector(spec: str | os.PathLike | dict | Detector) -> Detector:
    """Build a detector from a spec string, a YAML file path, a dict with ``family``, or return a detector as is.
    A YAML file's options are a file's, not the user's (:mod:`~halsift.filtering.detectors.trust`). The spec's
    tree rules (:func:`check_tree`) are checked before anything is built."""
    if isinstance(spec, Detector):
        return spec
    import warnings

    with warnings.catch_warnings():  # the build below warns about what a file may not set, once
        warnings.simplefilter("ignore")
        check_tree(spec_tree(spec))
    return _load(spec)


def _load(spec: str | os.PathLike | dict) -> Detector:
    if isinstance(spec, dict):
        family, opts, where = _split_family(spec)
        return _build(family, opts, where)
    text = os.fspath(spec)
    if _is_spec_file(text):
        data = _read_spec_file(Path(text))
        with trust.from_file(text):
            return _load(data)
    family, opts = parse_spec(text)
    return _build(family, opts, text)
