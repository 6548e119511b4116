"""Composed selection: several named score folders, field tables and exclusion lists, a ``--where`` expression and
a ``--rank`` expression (:mod:`halsift.filtering.selection.expression`), for both select engines.

Units. The first score folder (the primary) gives the units: its sentence rows for ``unit=sentence`` or
``agg=prune``, else one row per caption (its caption-level rows, or its sentences aggregated with ``agg``). Another
score folder joins on (key, sentence_index) when it is sentence-level (aggregated the same way for whole captions),
on key alone when it holds caption-level rows only (broadcast to every sentence of the key). Field tables (``halsift
basic``'s parts, or any parquet with a ``key`` column) and exclusions (a ``duplicates.parquet`` of ``halsift
dedup``, its folder, or a text file of keys, one a line) are caption-level: broadcast to every sentence of the key.

The candidates are the units where every clause holds: each top-level ``and`` term of ``--where`` and, with
``--exclude``, ``not excluded``; a missing value fails its clause. Their ``score`` is ``--rank`` (default: the
primary score); ``--keep`` / ``--top-k`` / ``--threshold`` then pick among them as in a plain select. The accounting
(:meth:`Composition.accounting`) counts, over all units, what each clause removes alone, removes and no other
clause does, the pairs removed by two clauses, and what the whole expression keeps.

Both engines run the same DuckDB query (one query, so the same units in memory and out of core): the in-memory
engine reads the candidates into memory; the out-of-core one (:func:`halsift.filtering.selection.out_of_core.top_keys`)
selects from the query as its score view, under its memory limit.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from halsift.corpus.fingerprint import file_fingerprint
from halsift.filtering.detectors.base import CAPTION_INDEX
from halsift.filtering.selection.expression import Expr, check_names, check_namespace, parse
from halsift.filtering.selection.score_folder import ScoreFolder, SelectError, check_repeated_rows, check_score_folder

EXCLUDE_CLAUSE = "not excluded"
MAX_PAIRS_CLAUSES = 16  # the accounting's overlaps: pairs among the first 16 clauses
DUPLICATES = "duplicates.parquet"


def split_scores(values: list[str] | str) -> list[tuple[str | None, str]]:
    """``--scores`` values -> ``[(name or None, path)]``: ``NAME=DIR`` names a folder (NAME an identifier, and
    the whole value not an existing path)."""
    out = []
    for v in [values] if isinstance(values, str) else values:
        name, sep, path = v.partition("=")
        if sep and name.isidentifier() and not os.path.exists(v):
            out.append((name, path))
        else:
            out.append((None, v))
    if len(out) > 1 and any(n is None for n, _ in out):
        raise SelectError("scores: name every folder when giving several, e.g. --scores judge=DIR1 "
                          "--scores clip=DIR2")
    check_namespace([(n, "scores") for n, _ in out if n is not None])
    return out


@dataclass
class _Scores:
    name: str
    path: Path
    folder: ScoreFolder
    caption_level: bool  # holds caption-level rows only: joined on key


@dataclass
class Composition:
    """Checked inputs of a composed selection (see the module docstring); build with :func:`composition`."""

    scores: list[_Scores]
    aliases: dict[str, int]  # expression name -> index into scores
    fields: list[Path]
    field_columns: list[str]
    exclude: list[Path]
    where: Expr | None
    rank: Expr | None
    digests: dict = field(default_factory=dict)
    float_fields: frozenset = frozenset()  # field columns of a floating type: NaN is read as missing

    # ------------------------------------------------------------------ what a selection records
    def record(self) -> dict:
        """What a selection's ``filter`` records (a rerun with another composition is refused)."""
        return {"scores": {s.name: str(s.path.resolve()) for s in self.scores}, "where": self.where and self.where.text,
                "rank": self.rank and self.rank.text, "fields": [str(p.resolve()) for p in self.fields],
                "exclude": [str(p.resolve()) for p in self.exclude], "digests": self.digests}

    def names(self) -> list[str]:
        return list(self.aliases) + self.field_columns

    # ------------------------------------------------------------------ SQL
    def _used_fields(self) -> list[tuple[int, str]]:
        """``(j, column)`` of the field columns the expressions name: only those are read (a field table such as
        ``halsift basic``'s holds a dozen columns per key, most of them unused by a given selection)."""
        used = {n for e in (self.where, self.rank) if e is not None for n in e.names}
        return [(j, c) for j, c in enumerate(self.field_columns) if c in used]

    def _columns(self) -> dict[str, str]:
        """Expression name -> its SQL in the join (score folder i's score, field column j)."""
        cols = {name: f'"s{i}"."score"' for name, i in self.aliases.items()}
        cols.update({c: f'"f"."c{j}"' for j, c in self._used_fields()})
        return cols

    def _wide(self) -> dict[str, str]:
        """Expression name -> its column in ``wide``: ``u0, u1, ...``, never the user's spelling, so that no user
        name can shadow an internal column (``key``, ``part``...) or another name."""
        return {name: f'"u{k}"' for k, name in enumerate(self._columns())}

    def _load(self, con, unit: str, agg: str) -> None:
        """Create the view ``wide``: key, sentence_index, part, every score and named field (``u0, u1...``),
        ``excluded``. Views over the parquet parts, not tables: DuckDB then holds no copy of the inputs, only the
        candidates table made from them (:meth:`create_candidates`) and each query's hash tables."""
        sentence_units = unit == "sentence" or agg == "prune"
        for i, s in enumerate(self.scores):
            files = "[" + ", ".join(_q(p) for p in s.folder.parts) + "]"
            det = f" AND detector = {_q(s.folder.detector)}" if s.folder.other_detectors else ""
            raw = (f"SELECT key, sentence_index::INTEGER AS sentence_index, {_nan_null('score::DOUBLE')} AS score, "
                   f"parse_filename(filename) AS part FROM read_parquet({files}, filename=true)")
            if s.caption_level:
                rows = f"SELECT * FROM ({raw}) WHERE sentence_index = {CAPTION_INDEX}{det}"
            elif sentence_units:
                rows = f"SELECT * FROM ({raw}) WHERE sentence_index <> {CAPTION_INDEX}{det}"
            else:
                rows = (f"SELECT key, {CAPTION_INDEX}::INTEGER AS sentence_index, {_agg_sql(agg)} AS score, "
                        f"min(part) AS part FROM ({raw}) WHERE sentence_index <> {CAPTION_INDEX}{det} GROUP BY key")
            con.execute(f'CREATE TEMP VIEW "s{i}" AS {rows}')
        base = self.scores[0]
        if base.caption_level and sentence_units:
            raise SelectError(f"scores: {base.path} holds caption-level scores (scored with unit=caption): use "
                              "--unit caption, or name a sentence-level folder first")
        joins = []
        for i, s in enumerate(self.scores[1:], 1):
            on = (f'"s{i}".key = "s0".key' if s.caption_level else
                  f'"s{i}".key = "s0".key AND "s{i}".sentence_index = "s0".sentence_index')
            joins.append(f'LEFT JOIN "s{i}" ON {on}')
        if self.fields:
            files = "[" + ", ".join(_q(p) for p in self.fields) + "]"
            sel = ", ".join(f'{_nan_null(_ident(c)) if c in self.float_fields else _ident(c)} AS "c{j}"'
                            for j, c in self._used_fields())
            con.execute(f'CREATE TEMP VIEW "f" AS SELECT key{", " + sel if sel else ""} '
                        f'FROM read_parquet({files}, union_by_name=true)')
            dup = con.execute('SELECT key, count(*) FROM "f" GROUP BY key HAVING count(*) > 1 LIMIT 1').fetchall()
            if dup:
                raise SelectError(f"fields: the key {dup[0][0]!r} has {dup[0][1]} rows in the field tables "
                                  f"({', '.join(map(str, self.fields[:3]))}...): one row per key expected")
            joins.append('LEFT JOIN "f" ON "f".key = "s0".key')
        excluded = "FALSE"
        if self.exclude:
            con.register("_excluded_keys", pa.table({"key": pa.array(sorted(_excluded(self.exclude)), pa.string())}))
            con.execute('CREATE TEMP TABLE "x" AS SELECT DISTINCT key FROM _excluded_keys')
            excluded = '("s0".key IN (SELECT key FROM "x"))'
        wide = self._wide()
        cols = ", ".join(f'{sql} AS {wide[name]}' for name, sql in self._columns().items())
        con.execute(f'CREATE TEMP VIEW wide AS SELECT "s0".key AS key, "s0".sentence_index AS sentence_index, '
                    f'"s0".part AS part, {excluded} AS _excluded, {cols} FROM "s0" {" ".join(joins)}')

    def _drop(self, con) -> None:
        """Drop the views (and the exclusion table) once the candidates are made."""
        con.execute("DROP VIEW IF EXISTS wide")
        if self.fields:
            con.execute('DROP VIEW IF EXISTS "f"')
        for i in range(len(self.scores)):
            con.execute(f'DROP VIEW IF EXISTS "s{i}"')
        if self.exclude:
            con.execute('DROP TABLE IF EXISTS "x"')
            con.unregister("_excluded_keys")

    def _clauses(self) -> list[tuple[str, str]]:
        """(text, SQL over ``wide`` that is TRUE when the clause holds) of each clause."""
        cols = self._wide()
        out = [(text, self.where.sql(cols, node)) for text, node in self.where.clauses()] if self.where else []
        if self.exclude:
            out.append((EXCLUDE_CLAUSE, "(NOT _excluded)"))
        return out

    def create_candidates(self, con, unit: str, agg: str, view: str = "scores") -> dict:
        """Create ``view`` (key, sentence_index, score, part: the candidates, score = rank) in DuckDB connection
        ``con``; returns the accounting. Parquet statistics written by pyarrow leave NaN out of min/max, and DuckDB's
        statistics propagation then folds ``isnan(x)`` to false: it is off while the views are read (NaN read as
        missing), until the candidates are a table."""
        con.execute("SET disabled_optimizers = 'statistics_propagation'")
        try:
            info = self._create_candidates(con, unit, agg, view)
        finally:
            con.execute("RESET disabled_optimizers")
        self._drop(con)
        return info

    def _create_candidates(self, con, unit: str, agg: str, view: str) -> dict:
        import duckdb

        self._load(con, unit, agg)
        cols = self._wide()
        rank = self.rank.sql(cols) if self.rank else cols[self.scores[0].name]
        clauses = self._clauses()
        where = " AND ".join(f"coalesce({sql}, FALSE)" for _, sql in clauses) or "TRUE"
        try:
            con.execute(f"CREATE TEMP TABLE {view} AS SELECT key, sentence_index, CAST({rank} AS DOUBLE) AS score, "
                        f"part FROM wide WHERE {where} AND ({rank}) IS NOT NULL")
            info = self._accounting(con, clauses, view)
        except duckdb.Error as e:  # e.g. a string field compared with a number
            first = str(e).strip().splitlines()[0]
            raise SelectError(f"where/rank: DuckDB could not evaluate {self.where and self.where.text!r} / "
                              f"{self.rank and self.rank.text!r}: {first}") from None
        return info

    def _accounting(self, con, clauses: list[tuple[str, str]], view: str) -> dict:
        # each clause's failure once, as a column of a table (linear in the clauses: "removed only" is "fails, and
        # one clause fails"); overlaps for the first MAX_PAIRS_CLAUSES clauses only (quadratic in them)
        fails = [f'"_fail{i}"' for i in range(len(clauses))]
        defs = ", ".join(f"NOT coalesce({sql}, FALSE) AS {f}" for (_, sql), f in zip(clauses, fails))
        nfail = " + ".join(f"{f}::INTEGER" for f in fails) or "0"
        fails_sql = f"SELECT {defs + ', ' if defs else ''}{nfail} AS _nfail FROM wide"  # one pass, not a table
        aggs = ["count(*)"]
        for f in fails:
            aggs += [f"count(*) FILTER ({f})", f"count(*) FILTER ({f} AND _nfail = 1)"]
        paired = fails[:MAX_PAIRS_CLAUSES]
        pairs = [(i, j) for i in range(len(paired)) for j in range(i + 1, len(paired))]
        aggs += [f"count(*) FILTER ({fails[i]} AND {fails[j]})" for i, j in pairs]
        aggs.append("count(*) FILTER (_nfail = 0)")
        row = con.execute(f"WITH _fails AS ({fails_sql}) SELECT {', '.join(aggs)} FROM _fails").fetchall()[0]
        n, rest = row[0], list(row[1:])
        per = [{"clause": text, "removed": rest[2 * i], "removed_only": rest[2 * i + 1]}
               for i, (text, _) in enumerate(clauses)]
        rest = rest[2 * len(clauses):]
        overlaps = [{"clauses": [clauses[i][0], clauses[j][0]], "removed": rest[k]} for k, (i, j) in enumerate(pairs)]
        passed = rest[len(pairs)]
        candidates = con.execute(f"SELECT count(*) FROM {view}").fetchall()[0][0]
        wide = self._wide()
        missing = {s.name: con.execute(f'SELECT count(*) FROM wide WHERE {wide[s.name]} IS NULL').fetchall()[0][0]
                   for s in self.scores[1:]}
        return {"units": n, "clauses": per, "overlaps": overlaps, "passed": passed,
                "rank_missing": passed - candidates, "candidates": candidates, "missing_scores": missing,
                "where": self.where and self.where.text, "rank": self.rank and self.rank.text,
                "scores": {s.name: str(s.path) for s in self.scores}, "fields": [str(p) for p in self.fields],
                "exclude": [str(p) for p in self.exclude]}

    def candidates(self, unit: str, agg: str) -> tuple[pa.Table, dict]:
        """The in-memory engine's candidates (key, sentence_index, score) and the accounting."""
        import duckdb

        con = duckdb.connect()
        try:
            info = self.create_candidates(con, unit, agg, "cands")
            t = con.sql("SELECT key, sentence_index, score FROM cands ORDER BY key, sentence_index").to_arrow_table()
        finally:
            con.close()
        return t.cast(pa.schema([("key", pa.string()), ("sentence_index", pa.int32()), ("score", pa.float64())])), info


def _nan_null(sql: str) -> str:
    """``sql`` with NaN read as missing (NULL): a NaN then satisfies no comparison and has no rank."""
    return f"(CASE WHEN isnan({sql}) THEN NULL ELSE {sql} END)"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _q(x) -> str:
    return "'" + str(x).replace("'", "''") + "'"


def _agg_sql(agg: str) -> str:
    return {"min": "min(score)", "mean": "avg(score)",
            "prob": "100 * exp(sum(ln(greatest(score / 100.0, 1e-9))))"}.get(agg, "min(score)")


def _parquet_files(path: Path, flag: str) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.glob("*.parquet") if not p.name.startswith("."))
        if not files:
            raise SelectError(f"{flag}: {path} holds no .parquet table")
        return files
    if not path.exists():
        raise SelectError(f"{flag}: {path} does not exist")
    return [path]


def _excluded(paths: list[Path]) -> set[str]:
    keys: set[str] = set()
    for p in paths:
        keys |= read_exclude(p)
    return keys


def read_exclude(path: Path, flag: str = "exclude") -> set[str]:
    """The keys of an ``--exclude`` file: a parquet with a ``key`` column (``halsift dedup``'s duplicates.parquet,
    or its folder), else a text file of keys, one a line (blank lines ignored)."""
    if path.is_dir():
        path = path / DUPLICATES
    if not path.is_file():
        raise SelectError(f"{flag}: {path} is not a file (expected a duplicates.parquet, its folder, or a text "
                          "file of keys)")
    if path.suffix == ".parquet":
        _key_columns(path, flag)
        return {str(k) for k in pq.read_table(path, columns=["key"])["key"].to_pylist() if k is not None}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SelectError(f"{flag}: {path} is neither parquet nor a UTF-8 text file of keys") from None
    return {line.strip() for line in text.splitlines() if line.strip()}


def _key_columns(path: Path, flag: str) -> list[str]:
    """The column names of a parquet file that must hold a ``key`` column; one line naming ``flag`` otherwise."""
    try:
        names = pq.read_schema(path).names
    except (pa.ArrowInvalid, OSError) as e:
        raise SelectError(f"{flag}: {path} is not readable parquet ({e})") from None
    if "key" not in names:
        raise SelectError(f"{flag}: {path} has no 'key' column (it has {', '.join(names)})")
    return names


def _field_schema(path: Path, flag: str) -> pa.Schema:
    """The schema of a field table: a string ``key`` column, one line naming ``flag`` and the file otherwise."""
    _key_columns(path, flag)
    schema = pq.read_schema(path)
    key = schema.field("key").type
    if not (pa.types.is_string(key) or pa.types.is_large_string(key)):
        raise SelectError(f"{flag}: the 'key' column of {path} holds {key}; sample keys are strings (write them as "
                          "text, e.g. '000123')")
    return schema


def _digest(paths: list[Path]) -> str:
    items = []
    for p in paths:
        fp = file_fingerprint(p)
        items.append([str(p.name), fp["size"], fp["hash"]])
    return hashlib.blake2b(json.dumps(items).encode(), digest_size=16).hexdigest()


def composition(scores: list[tuple[str | None, str]], *, fields: list[str] = (), exclude: list[str] = (),
                where: str | None = None, rank: str | None = None, detector: str | None = None,
                allow_partial: bool = False, prefix: str = "--") -> Composition:
    """Check every input of a composed selection and the expressions' names; raises :class:`SelectError` (one
    line) naming the flag (``prefix`` + its name: ``--where``, or a recipe's ``select.where``), the file or the
    unknown name and what is available."""
    parsed = {flag: parse(text, prefix + flag) for flag, text in (("where", where), ("rank", rank)) if text}
    named: list[_Scores] = []  # the expressions first: a refused one costs no folder check
    aliases: dict[str, int] = {}
    for i, (name, path) in enumerate(scores):
        folder = check_score_folder(path, detector if i == 0 else None, allow_partial)
        check_repeated_rows(folder, folder.detector if folder.other_detectors else None)
        caption_level = all(_caption_only(p) for p in folder.parts)
        label = name or "score"
        named.append(_Scores(label, Path(path), folder, caption_level))
        aliases[label] = i
    check_namespace([(a, f"{prefix}scores") for a in aliases])
    for i, s in enumerate(named):  # an unnamed folder also answers to its detector's name, where that is free
        det = s.folder.detector
        if scores[i][0] is None and det and det.isidentifier():
            try:
                check_namespace([(a, "") for a in aliases] + [(det, "")])
            except SelectError:
                continue
            aliases[det] = i
    field_files = [f for p in fields for f in _parquet_files(Path(p), f"{prefix}fields")]
    columns: list[str] = []
    floats: set[str] = set()
    spelled = [(a, f"{prefix}scores") for a in aliases]
    for f in field_files:
        schema = _field_schema(f, f"{prefix}fields")
        for c in schema.names:
            if c == "key" or c in columns or not c.isidentifier():
                continue  # the join key; seen in an earlier table; not nameable in an expression
            spelled.append((c, f"{prefix}fields: the column of {f}"))
            check_namespace(spelled)
            columns.append(c)
            if pa.types.is_floating(schema.field(c).type):
                floats.add(c)
    excl = [Path(p) / DUPLICATES if Path(p).is_dir() else Path(p) for p in exclude]
    for p in excl:
        read_exclude(p, f"{prefix}exclude")  # checked now: one line before anything is written
    available = list(aliases) + columns
    exprs = [parsed.get("where"), parsed.get("rank")]
    for e in exprs:
        if e is not None:
            check_names(e, available)
    digests = {"fields": _digest(field_files) if field_files else None, "exclude": _digest(excl) if excl else None,
               **{f"scores/{s.name}": s.folder.digest() for s in named}}
    return Composition(named, aliases, field_files, columns, excl, exprs[0], exprs[1], digests, frozenset(floats))


def _caption_only(p: Path) -> bool:
    """The part holds caption-level rows only (an empty part counts as such)."""
    col = pq.read_table(p, columns=["sentence_index"])["sentence_index"]
    return bool(pc.all(pc.equal(col, CAPTION_INDEX)).as_py()) if len(col) else True


