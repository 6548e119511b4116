"""Score tables (DESIGN.md, "Scores"): parquet parts, one per (rank, shard), plus ``_manifest.json``.

Columns: ``key`` (str), ``sentence_index`` (int32), ``score`` (float32, 0–100, higher = more likely correct),
``parsed`` (bool; false where a judge's output could not be parsed and the score fell back to 50),
``detector`` (str). A detector that localizes may add ``spans`` (list of [start_word, end_word) pairs).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from halsift.corpus.errors import InputError
from halsift.corpus.atomic import atomic_file

SCORE_COLUMNS = ("key", "sentence_index", "score", "parsed", "detector")
SCHEMA = pa.schema([
    ("key", pa.string()),
    ("sentence_index", pa.int32()),
    ("score", pa.float32()),
    ("parsed", pa.bool_()),
    ("detector", pa.string()),
])


def _number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


# columns stored as another numeric type (a float64 score, an int64 sentence_index from pandas or another tool) are
# read as their contract type, the cast checked (a sentence_index of 1.5 or 2**40 is refused); any other type (a
# string score) is refused, naming the part
COLUMN_KINDS = {"sentence_index": (_number, pa.int32(), "integers"), "score": (_number, pa.float32(), "numbers")}


class ScoresFormatError(InputError):
    """A score folder or part does not follow the contract; the message names the file and column."""


def check_column_types(path: str | os.PathLike, schema: pa.Schema) -> None:
    """Raise :class:`ScoresFormatError` naming ``path`` when a column of :data:`COLUMN_KINDS` in ``schema`` holds
    another kind of value (e.g. a string ``score``)."""
    for name, (ok, want, what) in COLUMN_KINDS.items():
        if name in schema.names and not ok(schema.field(name).type):
            raise ScoresFormatError(f"scores: {path} column {name!r} holds {schema.field(name).type}; expected "
                                    f"{what} (read as {want})")


def part_name(rank_or_tag: int | str, shard: str) -> str:
    """Name of the parquet part for one (rank, shard): ``part-<shard basename>.parquet``.

    The rank is not in the name so a rerun with a different world size still finds finished parts.
    """
    stem = Path(shard).name
    for suffix in (".tar", ".jsonl"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return f"part-{stem}.parquet"


def scores_table(keys: Sequence[str], sentence_index: Sequence[int], score: Sequence[float],
                 parsed: Sequence[bool], detector: str, extra: dict | None = None) -> pa.Table:
    """Build a table with the contract schema (plus optional extra columns)."""
    n = len(keys)
    cols = {
        "key": pa.array(list(keys), pa.string()),
        "sentence_index": pa.array(list(sentence_index), pa.int32()),
        "score": pa.array(list(score), pa.float32()),
        "parsed": pa.array(list(parsed), pa.bool_()),
        "detector": pa.array([detector] * n, pa.string()),
    }
    for name, values in (extra or {}).items():
        cols[name] = pa.array(list(values))
    return pa.table(cols)


def write_part_atomic(table: pa.Table, path: str | os.PathLike) -> None:
    """Write one parquet part through a temporary name, so a killed run never leaves a finished-looking part."""
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp)


def read_scores(path: str | os.PathLike, columns: Sequence[str] | None = None) -> pa.Table:
    """Read every finished part of a score folder (or one parquet file) into one table, checking the columns."""
    path = Path(path)
    if path.is_dir():
        parts = sorted(p for p in path.glob("*.parquet") if not p.name.startswith("."))
        if not parts:
            raise ScoresFormatError(f"scores: {path} holds no .parquet parts")
    elif path.exists():
        parts = [path]
    else:
        raise FileNotFoundError(f"scores: {path} does not exist")
    tables = [read_part(p, columns) for p in parts]
    try:
        return pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ScoresFormatError(f"scores: the parts of {path} have different schemas ({e})") from e


def read_part(path: str | os.PathLike, columns: Sequence[str] | None = None,
              read_dictionary: Sequence[str] = ()) -> pa.Table:
    """Read one parquet part, checking the columns; ``sentence_index`` and ``score`` are read as int32 and float32
    (older or foreign parts may hold int64 or float64: :data:`COLUMN_KINDS`). An unreadable file, or a column of
    another kind, raises :class:`ScoresFormatError` naming it."""
    try:
        names = pq.read_schema(path).names
        missing = [c for c in (columns or SCORE_COLUMNS) if c not in names]
        if missing:
            raise ScoresFormatError(f"scores: {path} lacks column(s) {missing}; expected {list(SCORE_COLUMNS)}")
        t = pq.read_table(path, columns=list(columns) if columns else None,
                          read_dictionary=list(read_dictionary) or None)
    except (pa.ArrowInvalid, OSError) as e:
        raise ScoresFormatError(f"scores: {path} is not a readable parquet file ({e})") from e
    check_column_types(path, t.schema)
    for name, (_, want, _) in COLUMN_KINDS.items():
        if name in t.column_names and t.schema.field(name).type != want:
            try:
                t = t.set_column(t.schema.get_field_index(name), name, t[name].cast(want))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:  # an int64 index beyond int32
                raise ScoresFormatError(f"scores: {path} column {name!r} does not fit {want} ({e})") from e
    return t


def read_scores_df(path: str | os.PathLike, columns: Sequence[str] | None = None):
    """:func:`read_scores` as a pandas DataFrame."""
    return read_scores(path, columns).to_pandas()
