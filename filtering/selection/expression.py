"""The ``--where`` / ``--rank`` expressions of a composed selection: Python syntax, parsed with :mod:`ast` and kept
only when every node is on a whitelist (comparisons, ``and`` / ``or`` / ``not``, ``+ - * /``, ``in (...)`` of
constants, names, numbers, strings, true/false), then written as a DuckDB SQL expression over named columns.

Why not DuckDB SQL directly: a user's SQL string could call any DuckDB function (read files, ``COPY``, attach
databases); rendering SQL from a whitelisted syntax tree leaves only arithmetic and comparisons on the columns
given. Why not ``eval``: never on user strings. SQL semantics apply: a comparison with a missing value (a key a
score folder or a field table lacks, or a NaN, read as missing) is unknown, and a unit whose ``--where`` is unknown
is not kept.

Names: a user's names (score folders, field columns) live in their own namespace: the SQL refers to each through
the column reference the caller maps it to, never by its own spelling, so no user name can shadow an internal column
or another one; :func:`check_namespace` refuses reserved names and names that differ only in case (SQL identifiers
are case-insensitive). Literals stay literals (``1e999`` is the number infinity, never a column ``inf``).

Bounded work: an expression longer than :data:`MAX_CHARS`, with more than :data:`MAX_NODES` syntax nodes, nested
deeper than :data:`MAX_DEPTH` or with more than :data:`MAX_CLAUSES` top-level ``and`` terms is refused in one line
before anything is parsed or evaluated further.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass

from halsift.filtering.selection.score_folder import SelectError

_CMP = {ast.Eq: "=", ast.NotEq: "<>", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
MAX_CHARS = 20_000  # characters of one expression
MAX_NODES = 4_000  # syntax nodes
MAX_DEPTH = 64  # nesting of operators and parentheses
MAX_CLAUSES = 256  # top-level ``and`` terms (each is accounted for separately)
RESERVED = ("key", "sentence_index", "part", "_excluded")  # internal columns: no user name may be spelled so
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
    text = text.strip()
    if len(text) > MAX_CHARS:
        raise SelectError(f"{flag}: the expression has {len(text)} characters; at most {MAX_CHARS} are allowed")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        if "nested" in str(e.msg):
            raise SelectError(f"{flag}: the expression is nested too deeply (at most {MAX_DEPTH} levels)") from None
        raise SelectError(f"{flag}: {_short(text)!r} is not an expression ({e.msg} at column {e.offset})") from None
    except ValueError as e:  # e.g. an integer literal of thousands of digits
        raise SelectError(f"{flag}: {_short(text)!r} is not an expression ({e})") from None
    except (RecursionError, MemoryError):
        raise SelectError(f"{flag}: the expression is nested too deeply (at most {MAX_DEPTH} levels)") from None
    _check_size(tree, flag)
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            what = type(node).__name__
            raise SelectError(f"{flag}: {what} is not allowed in {_short(text)!r} (use names, numbers, 'strings', "
                              "comparisons, and/or/not, + - * /, `x in ('a', 'b')`)")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool)):
            raise SelectError(f"{flag}: the constant {node.value!r} is not allowed in {_short(text)!r}")
        if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) >= 2 ** 63:
            raise SelectError(f"{flag}: an integer in {_short(text)!r} is out of range (|n| < 2**63; write a float "
                              "such as 1e30)")
        if isinstance(node, (ast.Tuple, ast.List)) and not all(isinstance(e, ast.Constant) for e in node.elts):
            raise SelectError(f"{flag}: `in (...)` takes constants only, in {_short(text)!r}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) != isinstance(right, (ast.Tuple, ast.List)):
                    raise SelectError(f"{flag}: `in` needs a list of constants, e.g. lang in ('en', 'de'), in "
                                      f"{_short(text)!r}")
        elif isinstance(node, (ast.Tuple, ast.List)) and not _in_compare(tree, node):
            raise SelectError(f"{flag}: a list is only allowed after `in`, in {_short(text)!r}")
    return Expr(flag, text.strip(), tree)


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _check_size(tree: ast.Expression, flag: str) -> None:
    """Refuse a tree over :data:`MAX_NODES` nodes, :data:`MAX_DEPTH` levels or :data:`MAX_CLAUSES` clauses (walked
    without recursion: a deep tree must not overflow the stack here)."""
    nodes, stack = 0, [(tree.body, 1)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            raise SelectError(f"{flag}: the expression is nested too deeply (at most {MAX_DEPTH} levels)")
        if nodes > MAX_NODES:
            raise SelectError(f"{flag}: the expression is too large (more than {MAX_NODES} terms and operators)")
        stack.extend((c, depth + 1) for c in ast.iter_child_nodes(node)
                     if not isinstance(c, (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)))
    body = tree.body
    if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) and len(body.values) > MAX_CLAUSES:
        raise SelectError(f"{flag}: the expression has {len(body.values)} clauses joined by `and`; at most "
                          f"{MAX_CLAUSES} are allowed")


def check_namespace(names: list[tuple[str, str]]) -> None:
    """Refuse (one line) a reserved name or two names equal but for case. ``names``: (name, what gives it, e.g.
    ``"--scores"`` or ``"the column of FILE"``) in the order given."""
    seen: dict[str, tuple[str, str]] = {}
    for name, source in names:
        low = name.casefold()
        if low in RESERVED:
            raise SelectError(f"{source}: {name!r} is a reserved name ({', '.join(RESERVED)}, in any case); "
                              "rename it")
        if low in seen:
            other, where = seen[low]
            same = "the same name" if other == name else "names that differ only in case"
            raise SelectError(f"{source}: {name!r} and {other!r} ({where}) are {same}; names are "
                              "case-insensitive: rename one")
        seen[low] = (name, source)


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
    if isinstance(v, float):  # inf and nan as quoted text: a bare `inf` would be a column name in SQL
        return f"CAST({v!r} AS DOUBLE)" if math.isfinite(v) else f"CAST('{v!r}' AS DOUBLE)"
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
