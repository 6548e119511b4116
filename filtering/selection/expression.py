"""The ``--where`` / ``--rank`` expressions of a composed selection: Python syntax, parsed with :mod:`ast` and kept
only when every node is on a whitelist (comparisons, ``and`` / ``or`` / ``not``, ``+ - * /``, ``in (...)`` of
constants, names, numbers, strings, true/false), then written as a DuckDB SQL expression over named columns.

Why not DuckDB SQL directly: a user's SQL string could call any DuckDB function (read files, ``COPY``, attach
databases); rendering SQL from a whitelisted syntax tree leaves only arithmetic and comparisons on the columns
given. Why not ``eval``: never on user strings. SQL semantics apply: a comparison with a missing value (a key a
score folder or a field table lacks) is unknown, and a unit whose ``--where`` is unknown is not kept.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

from halsift.filtering.selection.score_folder import SelectError

_CMP = {ast.Eq: "=", ast.NotEq: "<>", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
            ast.Compare, ast.Name, ast.Load, ast.Constant, ast.In, ast.NotIn, ast.Tuple, ast.List,
            *_CMP, *_BIN)


@dataclass(frozen=True)
class Expr:
    """A checked expression: its text, syntax tree and the names it uses."""

    flag: str  # the flag or key that gave it (named in errors)
    text: str
    tree: ast.Expression

    @property
    def names(self) -> list[str]:
        return sorted({n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)})

    def clauses(self) -> list[tuple[str, ast.AST]]:
        """The top-level ``and`` terms with their source text (one term when there is no top-level ``and``)."""
        body = self.tree.body
        terms = body.values if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) else [body]
        return [(ast.get_source_segment(self.text, t) or ast.unparse(t), t) for t in terms]

    def sql(self, columns: Mapping[str, str], node: ast.AST | None = None) -> str:
        """The expression (or ``node`` of it) as DuckDB SQL; ``columns``: name -> SQL column reference."""
        return _sql(self.tree.body if node is None else node, columns)


def parse(text: str, flag: str) -> Expr:
    """Parse and check ``text``; raises :class:`SelectError` naming ``flag`` and what is not allowed."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise SelectError(f"{flag}: {text!r} is not an expression ({e.msg} at column {e.offset})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            what = type(node).__name__
            raise SelectError(f"{flag}: {what} is not allowed in {text!r} (use names, numbers, 'strings', "
                              "comparisons, and/or/not, + - * /, `x in ('a', 'b')`)")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool)):
            raise SelectError(f"{flag}: the constant {node.value!r} is not allowed in {text!r}")
        if isinstance(node, (ast.Tuple, ast.List)) and not all(isinstance(e, ast.Constant) for e in node.elts):
            raise SelectError(f"{flag}: `in (...)` takes constants only, in {text!r}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) != isinstance(right, (ast.Tuple, ast.List)):
                    raise SelectError(f"{flag}: `in` needs a list of constants, e.g. lang in ('en', 'de'), in "
                                      f"{text!r}")
        elif isinstance(node, (ast.Tuple, ast.List)) and not _in_compare(tree, node):
            raise SelectError(f"{flag}: a list is only allowed after `in`, in {text!r}")
    return Expr(flag, text.strip(), tree)


def _in_compare(tree: ast.AST, target: ast.AST) -> bool:
    return any(isinstance(n, ast.Compare) and any(c is target for c in n.comparators) for n in ast.walk(tree))


def check_names(expr: Expr, available: list[str]) -> None:
    """Raise :class:`SelectError` naming the first name of ``expr`` not in ``available``, and what is."""
    missing = [n for n in expr.names if n not in available]
    if missing:
        raise SelectError(f"{expr.flag}: {missing[0]!r} is not a score or field here; available: "
                          f"{', '.join(available) or '(none)'}")


def _const(v) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, float):
        return f"CAST({v!r} AS DOUBLE)"
    return str(int(v))


def _sql(node: ast.AST, cols: Mapping[str, str]) -> str:
    if isinstance(node, ast.BoolOp):
        op = " AND " if isinstance(node.op, ast.And) else " OR "
        return "(" + op.join(_sql(v, cols) for v in node.values) + ")"
    if isinstance(node, ast.UnaryOp):
        sign = {ast.Not: "NOT ", ast.USub: "-", ast.UAdd: "+"}[type(node.op)]
        return f"({sign}{_sql(node.operand, cols)})"
    if isinstance(node, ast.BinOp):
        left, right = _sql(node.left, cols), _sql(node.right, cols)
        if isinstance(node.op, ast.Div):  # a float division, whatever the operands' types
            return f"(CAST({left} AS DOUBLE) / NULLIF(CAST({right} AS DOUBLE), 0))"
        return f"({left} {_BIN[type(node.op)]} {right})"
    if isinstance(node, ast.Compare):
        terms, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)):
                values = ", ".join(_const(e.value) for e in right.elts)
                terms.append(f"({_sql(left, cols)} {'NOT IN' if isinstance(op, ast.NotIn) else 'IN'} ({values}))")
            else:
                terms.append(f"({_sql(left, cols)} {_CMP[type(op)]} {_sql(right, cols)})")
            left = right
        return terms[0] if len(terms) == 1 else "(" + " AND ".join(terms) + ")"
    if isinstance(node, ast.Name):
        return cols[node.id]
    if isinstance(node, ast.Constant):
        return _const(node.value)
    raise SelectError(f"{type(node).__name__} is not allowed")  # parse() refused it already
