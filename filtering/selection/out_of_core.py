"""The kept units of a selection, found out-of-core: DuckDB over the score parts, under a memory limit.

Gives the same kept set as :func:`halsift.filtering.selection.select.select_keys` (the cut-off is the ``n``-th highest score;
units tied at the cut-off are broken by ``hash_uniform(seed, key, sentence_index)``, lowest first) without holding
the score table in memory: DuckDB counts, finds the cut-off from a score histogram, and writes ``kept.parquet``
sorted by (key, sentence_index) with its out-of-core sort, spilling to ``spill_dir`` beyond ``memory_limit``. Only
the rows tied at the cut-off come into Python (to hash them). It also writes the kept units sorted by score part
(``_kept_by_part.parquet``), so that resharding reads one input shard's kept units at a time.

Measured (``benchmarks/select_scale.py``, 2 shared cores): 10M rows / 200 parts in 1.9 s at 444 MB peak RSS (the
in-memory pyarrow path: 3.9 s, 1037 MB); 30M rows in 5.3 s at 909 MB, and at 686 / 445 MB with ``memory_limit``
512MB / 256MB -- peak RSS stays near the limit plus ~200 MB; 100M rows / 2000 parts in 42.3 s at 1188 MB with
a 1GB limit (61.9 s on the 2 cores shared with other sessions). The default is 128MB: 30M rows in 15.2 s at
321 MB, 100M rows in 58.1 s at 350 MB (2 cores shared with a dedup benchmark), and the composed selection of
``benchmarks/million.py`` at 1M captions finds its keys at 349 MB instead of 545 MB. A
top-N query with an offset of ``n`` for the cut-off held its ``n`` rows in memory (770 MB at 30M rows); the
histogram does not. Polars' streaming engine took 2.4 s / 299 MB on 10M rows (sort + gather; its ``top_k`` 20.7 s)
against DuckDB's 4.7 s / 288 MB in the same busy moment: DuckDB is used because its memory limit and spill bound
the sort that writes the kept table whatever its size, which Polars' streaming sort does not promise.

Supported: ``unit=sentence``, ``unit=caption`` with ``agg`` ``prune`` or ``min`` (min is exact in any engine), or
caption-level scores; ``keep``, ``top_k`` or ``threshold``. ``per_captioner``, ``random_baseline`` and
``agg`` ``mean``/``prob`` (sums whose last bit differs between engines) stay with the in-memory path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from halsift.corpus.units import AGGS, UNITS
from halsift.corpus.safe_paths import remove_tree
from halsift.filtering.detectors.base import CAPTION_INDEX
from halsift.filtering.detectors.baselines import hash_uniform
from halsift.filtering.selection.select import SelectError

MEMORY_LIMIT = "128MB"  # measured below: 3.4x less memory than 1GB at 100M rows for a few seconds per 10M
BY_PART = "_kept_by_part.parquet"


def supported(unit: str, agg: str, per_captioner: bool = False, random_baseline: bool = False) -> str | None:
    """``None`` when the out-of-core path gives the in-memory selection exactly, else why not (one line)."""
    if per_captioner:
        return "per_captioner selection"
    if random_baseline:
        return "the random baseline"
    if unit == "caption" and agg in ("mean", "prob"):
        return f"caption agg={agg} (use min or prune)"
    return None


def _q(path: Path | str) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _num(x: float) -> str:
    """A float as an exact DuckDB DOUBLE literal (a bare ``86.25`` would be a DECIMAL)."""
    return f"CAST({float(x)!r} AS DOUBLE)"


def score_files(scores_dir: str | os.PathLike) -> list[Path]:
    """The finished parts of a score folder (as :func:`halsift.corpus.scores.read_scores` reads them)."""
    d = Path(scores_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"scores: {d} is not a folder")
    files = sorted(p for p in d.glob("*.parquet") if not p.name.startswith("."))
    if not files:
        raise SelectError(f"scores: {d} holds no .parquet parts")
    return files


def connect(spill_dir: Path, memory_limit: str = MEMORY_LIMIT, threads: int | None = None):
    """A DuckDB connection that spills to ``spill_dir`` beyond ``memory_limit`` (a size such as ``512MB``, read once
    into bytes by :func:`halsift.corpus.ranges.byte_size`: DuckDB is given a byte count, never the user's text)."""
    import duckdb

    from halsift.corpus.ranges import byte_size

    con = duckdb.connect()
    spill_dir.mkdir(parents=True, exist_ok=True)
    con.execute(f"SET memory_limit='{byte_size(memory_limit)}B'")
    con.execute(f"SET temp_directory={_q(spill_dir)}")
    con.execute("SET preserve_insertion_order=false")
    con.execute(f"SET threads={int(threads or os.cpu_count() or 1)}")
    return con


def top_keys(scores_dir: str | os.PathLike, out_dir: str | os.PathLike, *, memory_limit: str = MEMORY_LIMIT,
             **how: Any) -> dict:
    """Write ``out_dir/kept.parquet`` (``key``, ``sentence_index``, ``score``; sorted) and
    ``out_dir/_kept_by_part.parquet``; ``how``: ``keep`` / ``top_k`` / ``threshold``, ``unit``, ``agg``, ``seed``,
    ``threads``, ``detector`` (only that detector's rows count) and ``compose``.
    Returns the info :func:`select_keys` returns (``score_rows``, ``candidates``, ``selected``,
    ``threshold_used``). Files are written under temporary names and renamed when complete. The folder is not
    checked here: callers run :func:`halsift.filtering.selection.score_folder.check_score_folder` first. With
    ``compose`` (a :class:`halsift.filtering.selection.compose.Composition`), the units are its candidates and the
    info holds its accounting (``composition``). DuckDB running out of memory under ``memory_limit`` (its need
    grows with its threads) is one line asking for a larger limit."""
    import duckdb

    try:
        return _top_keys(scores_dir, out_dir, memory_limit=memory_limit, **how)
    except duckdb.OutOfMemoryException as e:
        why = (str(e).splitlines() or [""])[0]
        raise SelectError(f"--memory-limit {memory_limit}: DuckDB ran out of memory selecting from {scores_dir} "
                          f"({why}); give a larger --memory-limit") from None


def _top_keys(scores_dir: str | os.PathLike, out_dir: str | os.PathLike, *, keep: float | None = None,
              top_k: int | None = None, threshold: float | None = None, unit: str = "sentence", agg: str = "min",
              seed: int = 0, memory_limit: str = MEMORY_LIMIT, threads: int | None = None,
              detector: str | None = None, compose=None) -> dict:
    if sum(x is not None for x in (keep, top_k, threshold)) != 1:
        raise SelectError("give exactly one of keep (fraction), top_k (count) or threshold (score)")
    if keep is not None and not 0 < keep <= 1:
        raise SelectError(f"keep={keep}: expected a fraction in (0, 1]")
    if top_k is not None and top_k < 0:
        raise SelectError(f"top_k={top_k}: expected >= 0")
    if unit not in UNITS or agg not in AGGS:
        raise SelectError(f"unit={unit!r}, agg={agg!r}: expected unit in {UNITS}, agg in {AGGS}")
    why = supported(unit, agg)
    if why:
        raise SelectError(f"out-of-core selection does not support {why}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".select-work"
    remove_tree(work, ignore_errors=True)
    con = connect(work / "spill", memory_limit, threads)
    accounting = None
    if compose is not None:
        try:
            accounting = compose.create_candidates(con, unit, agg, "scores")
        except BaseException:
            con.close()
            remove_tree(work, ignore_errors=True)
            raise
    else:
        files = "[" + ", ".join(_q(f) for f in score_files(scores_dir)) + "]"
        con.execute(f"CREATE VIEW scores AS SELECT key, sentence_index, score, parse_filename(filename) AS part "
                    f"FROM read_parquet({files}, filename=true)"
                    + (f" WHERE detector = {_q(detector)}" if detector is not None else ""))
    n_rows, n_cap = con.execute(f"SELECT count(*), count(*) FILTER (sentence_index = {CAPTION_INDEX}) "
                                "FROM scores").fetchall()[0]
    sentence_rows = f"SELECT * FROM scores WHERE sentence_index <> {CAPTION_INDEX}"
    if unit == "sentence" or agg == "prune":
        if n_cap and n_cap == n_rows:
            raise SelectError("scores are caption-level (scored with unit=caption): use unit='caption' "
                              "with agg min/mean/prob")
        units = sentence_rows
    elif n_cap == n_rows:
        units = "SELECT * FROM scores"
    else:  # whole captions by their lowest sentence score; the part of a caption is its sentences' part
        units = (f"SELECT key, {CAPTION_INDEX}::INTEGER AS sentence_index, min(score)::DOUBLE AS score, "
                 f"min(part) AS part FROM ({sentence_rows}) GROUP BY key")
    # aggregated captions are computed once (a table DuckDB spills beyond its limit); sentence rows are re-read
    con.execute(f"CREATE {'TEMP TABLE' if 'GROUP BY' in units else 'VIEW'} units AS {units}")
    n_units = con.execute("SELECT count(*) FROM units").fetchall()[0][0]
    if threshold is not None:
        where, cut = f"score >= {_num(threshold)}", float(threshold)
        n = con.execute(f"SELECT count(*) FROM units WHERE {where}").fetchall()[0][0]
    else:
        n = int(np.floor(keep * n_units + 0.5)) if keep is not None else min(top_k, n_units)
        where, cut = _cut(con, n, n_units, seed)
    tmp_kept = work / "kept.parquet"
    con.execute(f"COPY (SELECT key, sentence_index, score FROM units WHERE {where} ORDER BY key, sentence_index) "
                f"TO {_q(tmp_kept)} (FORMAT parquet)")
    # one file sorted by part: a shard's kept units are a few row groups, found by their min/max statistics
    con.execute(f"COPY (SELECT part, key, sentence_index FROM units WHERE {where} ORDER BY part, key, sentence_index) "
                f"TO {_q(work / BY_PART)} (FORMAT parquet, ROW_GROUP_SIZE 65536)")
    con.close()
    os.replace(work / BY_PART, out / BY_PART)
    os.replace(tmp_kept, out / "kept.parquet")
    remove_tree(work, ignore_errors=True)
    return {"score_rows": int(n_rows), "candidates": int(n_units), "selected": int(n), "threshold_used": cut,
            **({"composition": accounting} if accounting is not None else {})}


def _cut(con, n: int, n_units: int, seed: int) -> tuple[str, float | None]:
    """The WHERE clause keeping the ``n`` best units, and the cut-off score (as ``select._top_n``)."""
    if n <= 0:
        return "false", None
    if n >= n_units:
        return "true", float(con.execute("SELECT min(score) FROM units").fetchall()[0][0])
    # the n-th highest score from a histogram (GROUP BY spills; a top-N with an offset of n holds n rows in memory)
    cut = float(con.execute("SELECT score FROM (SELECT score, sum(c) OVER (ORDER BY score DESC) AS cum FROM "
                            "(SELECT score, count(*) AS c FROM units GROUP BY score)) "
                            f"WHERE cum >= {n} ORDER BY score DESC LIMIT 1").fetchall()[0][0])
    above = con.execute(f"SELECT count(*) FROM units WHERE score > {_num(cut)}").fetchall()[0][0]
    ties = con.sql(f"SELECT key, sentence_index FROM units WHERE score = {_num(cut)}").to_arrow_table()
    need = n - above
    if need >= len(ties):
        return f"score >= {_num(cut)}", cut
    h = np.fromiter((hash_uniform(seed, k, i) for k, i in zip(ties["key"].to_pylist(),
                                                            ties["sentence_index"].to_pylist())), np.float64, len(ties))
    chosen = ties.take(pa.array(np.argsort(h, kind="stable")[:need]))
    con.register("tie_keep", chosen)
    con.execute("CREATE TEMP TABLE ties_kept AS SELECT * FROM tie_keep")
    pair = "concat(key, chr(0), sentence_index)"
    return (f"(score > {_num(cut)} OR (score = {_num(cut)} AND {pair} IN (SELECT {pair} FROM ties_kept)))"), cut


def kept_for_part(out_dir: str | os.PathLike, part: str) -> pa.Table:
    """The kept ``key`` / ``sentence_index`` rows of one score part (empty when it kept nothing)."""
    import pyarrow.parquet as pq

    return pq.read_table(Path(out_dir) / BY_PART, columns=["key", "sentence_index"], filters=[("part", "=", part)])
