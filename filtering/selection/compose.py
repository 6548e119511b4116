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
from halsift.filtering.selection.expression import Expr, check_names, parse
from halsift.filtering.selection.score_folder import ScoreFolder, SelectError, check_repeated_rows, check_score_folder

EXCLUDE_CLAUSE = "not excluded"
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
    names = [n for n, _ in out]
    dup = next((n for n in names if n is not None and names.count(n) > 1), None)
    if dup:
        raise SelectError(f"scores: the name {dup!r} is given twice")
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

    # ------------------------------------------------------------------ what a selection records
    def record(self) -> dict:
        """What a selection's ``filter`` records (a rerun with another composition is refused)."""
        return {"scores": {s.name: str(s.path.resolve()) for s in self.scores}, "where": self.where and self.where.text,
                "rank": self.rank and self.rank.text, "fields": [str(p.resolve()) for p in self.fields],
                "exclude": [str(p.resolve()) for p in self.exclude], "digests": self.digests}

    def names(self) -> list[str]:
        return list(self.aliases) + self.field_columns

    # ------------------------------------------------------------------ SQL
    def _columns(self) -> dict[str, str]:
        cols = {name: f'"s{i}"."score"' for name, i in self.aliases.items()}
        cols.update({c: f'"f"."{c}"' for c in self.field_columns})
        return cols

    def _views(self, con, unit: str, agg: str) -> None:
        """Create the view ``wide``: key, sentence_index, part, every score by name, every field, ``excluded``."""
        sentence_units = unit == "sentence" or agg == "prune"
        for i, s in enumerate(self.scores):
            files = "[" + ", ".join(_q(p) for p in s.folder.parts) + "]"
            det = f" AND detector = {_q(s.folder.detector)}" if s.folder.other_detectors else ""
            raw = (f"SELECT key, sentence_index::INTEGER AS sentence_index, score::DOUBLE AS score, "
                   f"parse_filename(filename) AS part FROM read_parquet({files}, filename=true)")
            if s.caption_level:
                rows = f"SELECT * FROM ({raw}) WHERE sentence_index = {CAPTION_INDEX}{det}"
            elif sentence_units:
                rows = f"SELECT * FROM ({raw}) WHERE sentence_index <> {CAPTION_INDEX}{det}"
            else:
                rows = (f"SELECT key, {CAPTION_INDEX}::INTEGER AS sentence_index, {_agg_sql(agg)} AS score, "
                        f"min(part) AS part FROM ({raw}) WHERE sentence_index <> {CAPTION_INDEX}{det} GROUP BY key")
            con.execute(f'CREATE TEMP TABLE "s{i}" AS {rows}')
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
            con.execute(f'CREATE TEMP TABLE "f" AS SELECT * FROM read_parquet({files}, union_by_name=true)')
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
        cols = ", ".join(f'{sql} AS "{name}"' for name, sql in self._columns().items())
        con.execute(f'CREATE TEMP TABLE wide AS SELECT "s0".key AS key, "s0".sentence_index AS sentence_index, '
                    f'"s0".part AS part, {excluded} AS _excluded, {cols} FROM "s0" {" ".join(joins)}')

    def _clauses(self) -> list[tuple[str, str]]:
        """(text, SQL over ``wide`` that is TRUE when the clause holds) of each clause."""
        cols = {name: f'"{name}"' for name in self._columns()}
        out = [(text, self.where.sql(cols, node)) for text, node in self.where.clauses()] if self.where else []
        if self.exclude:
            out.append((EXCLUDE_CLAUSE, "(NOT _excluded)"))
        return out

    def create_candidates(self, con, unit: str, agg: str, view: str = "scores") -> dict:
        """Create ``view`` (key, sentence_index, score, part: the candidates, score = rank) in DuckDB connection
        ``con``; returns the accounting."""
        import duckdb

        self._views(con, unit, agg)
        cols = {name: f'"{name}"' for name in self._columns()}
        rank = self.rank.sql(cols) if self.rank else f'"{self.scores[0].name}"'
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
        fails = [f"NOT coalesce({sql}, FALSE)" for _, sql in clauses]
        aggs = ["count(*)"]
        for i, f in enumerate(fails):
            others = " OR ".join(g for j, g in enumerate(fails) if j != i) or "FALSE"
            aggs += [f"count(*) FILTER ({f})", f"count(*) FILTER (({f}) AND NOT ({others}))"]
        pairs = [(i, j) for i in range(len(fails)) for j in range(i + 1, len(fails))]
        aggs += [f"count(*) FILTER (({fails[i]}) AND ({fails[j]}))" for i, j in pairs]
        aggs.append(f"count(*) FILTER (NOT ({' OR '.join(fails) or 'FALSE'}))")
        row = con.execute(f"SELECT {', '.join(aggs)} FROM wide").fetchall()[0]
        n, rest = row[0], list(row[1:])
        per = [{"clause": text, "removed": rest[2 * i], "removed_only": rest[2 * i + 1]}
               for i, (text, _) in enumerate(clauses)]
        rest = rest[2 * len(clauses):]
        overlaps = [{"clauses": [clauses[i][0], clauses[j][0]], "removed": rest[k]} for k, (i, j) in enumerate(pairs)]
        passed = rest[len(pairs)]
        candidates = con.execute(f"SELECT count(*) FROM {view}").fetchall()[0][0]
        missing = {s.name: con.execute(f'SELECT count(*) FROM wide WHERE "{s.name}" IS NULL').fetchall()[0][0]
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
    named: list[_Scores] = []
    aliases: dict[str, int] = {}
    for i, (name, path) in enumerate(scores):
        folder = check_score_folder(path, detector if i == 0 else None, allow_partial)
        check_repeated_rows(folder, folder.detector if folder.other_detectors else None)
        caption_level = all(_caption_only(p) for p in folder.parts)
        label = name or "score"
        named.append(_Scores(label, Path(path), folder, caption_level))
        aliases[label] = i
        if name is None and folder.detector and folder.detector.isidentifier() and folder.detector != "score":
            aliases.setdefault(folder.detector, i)  # an unnamed folder also answers to its detector's name
    field_files = [f for p in fields for f in _parquet_files(Path(p), f"{prefix}fields")]
    columns: list[str] = []
    for f in field_files:
        names = _key_columns(f, f"{prefix}fields")
        for c in names:
            if c == "key" or c in columns:
                continue
            if c in aliases:
                raise SelectError(f"{prefix}fields: the column {c!r} of {f} has the name of a score folder; rename one")
            if not c.isidentifier():
                continue  # not nameable in an expression
            columns.append(c)
    excl = [Path(p) / DUPLICATES if Path(p).is_dir() else Path(p) for p in exclude]
    for p in excl:
        read_exclude(p, f"{prefix}exclude")  # checked now: one line before anything is written
    available = list(aliases) + columns
    exprs = []
    for flag, text in (("where", where), ("rank", rank)):
        if text:
            e = parse(text, prefix + flag)
            check_names(e, available)
            exprs.append(e)
        else:
            exprs.append(None)
    digests = {"fields": _digest(field_files) if field_files else None, "exclude": _digest(excl) if excl else None,
               **{f"scores/{s.name}": s.folder.digest() for s in named}}
    return Composition(named, aliases, field_files, columns, excl, exprs[0], exprs[1], digests)


def _caption_only(p: Path) -> bool:
    """The part holds caption-level rows only (an empty part counts as such)."""
    col = pq.read_table(p, columns=["sentence_index"])["sentence_index"]
    return bool(pc.all(pc.equal(col, CAPTION_INDEX)).as_py()) if len(col) else True


