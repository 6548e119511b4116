"""Bounded YAML and bounded reprs for everything halsift reads from users: recipes, detector spec files,
adapter folders. Safe loading (no Python objects) with alias expansion capped, so a few hundred bytes cannot
expand to gigabytes; error messages echo values through a size-bounded ``reprlib``."""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

MAX_YAML_NODES = 100_000  # nodes after alias expansion: far above any config, far below a "billion laughs"
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlist = _SHORT.maxdict = _SHORT.maxtuple = _SHORT.maxset = 6
_SHORT.maxlevel = 3


def short_repr(value: Any) -> str:
    """``repr`` bounded in size and depth (reprlib), so that an error message never echoes a huge value."""
    return _SHORT.repr(value)


def clip_text(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters (with '...')."""
    return text if len(text) <= limit else text[:limit] + "..."


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a document whose aliases expand to more than :data:`MAX_YAML_NODES`
    nodes (an alias bomb: a few hundred bytes that would expand to gigabytes when printed or walked)."""

    def compose_document(self):
        node = super().compose_document()
        if node is not None:
            _refuse_recursion(node, [], set(), set())
        if _expanded_size(node, {}) > MAX_YAML_NODES:
            raise yaml.YAMLError(f"aliases expand to more than {MAX_YAML_NODES} nodes (an alias bomb?)")
        return node


def _refuse_recursion(node: yaml.Node, path: list[str], open_: set[int], done: set[int]) -> None:
    """Raise ``yaml.YAMLError`` naming the key (``a.b[2]``) and line of an alias that contains itself (``&x [*x]``):
    no value of a config can be infinite. Each node is walked once (``done``), so an alias bomb costs its size."""
    if id(node) in done:
        return
    if id(node) in open_:
        where = ".".join(path) or "(top level)"
        raise yaml.YAMLError(f"the key {where} (line {node.start_mark.line + 1}) is a recursive alias: it contains "
                             "itself")
    children: list[tuple[str, yaml.Node]] = []
    if isinstance(node, yaml.SequenceNode):
        children = [(f"[{i}]", c) for i, c in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode):
        children = [(str(k.value) if isinstance(k, yaml.ScalarNode) else "?", v) for k, v in node.value]
    if not children:
        return
    open_.add(id(node))
    for name, child in children:
        step = path[:-1] + [path[-1] + name] if name.startswith("[") and path else path + [name]
        _refuse_recursion(child, step, open_, done)
    open_.discard(id(node))
    done.add(id(node))


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Number of nodes ``node`` stands for once every alias is expanded (capped just above the limit)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a recursive alias counts once
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded_size(c, memo) for c in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[key] = min(total, MAX_YAML_NODES + 1)
    return memo[key]


def safe_load_yaml(text: str) -> Any:
    """``yaml.safe_load`` with alias expansion capped (raises ``yaml.YAMLError`` beyond it)."""
    return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
