"""Composed selection's expression rules (issue 41): user names in their own namespace (no shadowing of internal
columns or of each other, reserved and case-colliding names refused in one line, literals stay literals); NaN read
as missing in both engines; expressions of bounded size and depth, refused in one line past the limits."""

from __future__ import annotations

import json
import math

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from filtering_data import make_corpus

from halsift.corpus.scores import read_scores_df
from halsift.filtering.scoring.runner import score
from halsift.filtering.selection.expression import MAX_CLAUSES, MAX_DEPTH, check_namespace, parse
from halsift.filtering.selection.score_folder import SelectError
from halsift.launch.cli import main


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """24 samples scored by oracle ('judge') and random ('clip'); their caption-level judge scores by key."""
    d = tmp_path_factory.mktemp("names")
    corpus = make_corpus(d / "corpus", shards=4, per_shard=6)
    score("oracle", corpus, d / "judge", show_progress=False)
    score("random:seed=1", corpus, d / "clip", show_progress=False)
    j = read_scores_df(d / "judge")
    return corpus, d, j[j["sentence_index"] >= 0]


def _fields(d, name: str, table: dict) -> str:
    p = d / f"{name}.parquet"
    pq.write_table(pa.table(table), p)
    return str(p)


def _select(corpus, d, out, *extra, scores=None):
    scores = scores or ["--scores", f"judge={d / 'judge'}", "--scores", f"clip={d / 'clip'}"]
    return main(["select", *scores, "--data", str(corpus), "--out", str(out), "--no-progress", *extra])


def _kept(out) -> set:
    k = pq.read_table(out / "kept.parquet").to_pandas()
    return set(zip(k["key"], k["sentence_index"]))


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


# ---------------------------------------------------------------- names
@pytest.mark.parametrize("name", ["sentence_index", "_excluded", "key", "Part", "KEY"])
def test_a_reserved_score_name_is_refused_in_one_line(world, tmp_path, capsys, name):
    corpus, d, _ = world
    assert _select(corpus, d, tmp_path / "s", "--keep", "1",
                   scores=["--scores", f"{name}={d / 'judge'}", "--scores", f"clip={d / 'clip'}"]) == 2
    _one_line_error(capsys, repr(name), "reserved")
    assert not (tmp_path / "s" / "kept.parquet").exists()


@pytest.mark.parametrize("a,b", [("a", "A"), ("judge", "JUDGE"), ("x", "x")])
def test_score_names_equal_but_for_case_are_refused(world, tmp_path, capsys, a, b):
    corpus, d, _ = world
    assert _select(corpus, d, tmp_path / "s", "--keep", "1",
                   scores=["--scores", f"{a}={d / 'judge'}", "--scores", f"{b}={d / 'clip'}"]) == 2
    _one_line_error(capsys, repr(a), repr(b))


@pytest.mark.parametrize("column", ["part", "Key", "sentence_index", "_excluded", "SENTENCE_INDEX"])
def test_a_field_column_with_a_reserved_name_is_refused(world, tmp_path, capsys, column):
    corpus, d, j = world
    keys = sorted(j["key"].unique())
    f = _fields(tmp_path, "f", {"key": keys, column: list(range(len(keys)))})
    assert _select(corpus, d, tmp_path / "s", "--fields", f, "--keep", "1") == 2
    _one_line_error(capsys, repr(column), "reserved", "f.parquet")


@pytest.mark.parametrize("column,scores", [("R", ["r"]), ("Judge", ["judge", "clip"]), ("CLIP", ["judge", "clip"])])
def test_a_field_column_equal_to_a_score_name_but_for_case_is_refused(world, tmp_path, capsys, column, scores):
    corpus, d, j = world
    keys = sorted(j["key"].unique())
    f = _fields(tmp_path, "f", {"key": keys, column: [1.0] * len(keys)})
    flags = [x for name, folder in zip(scores, ("judge", "clip")) for x in ("--scores", f"{name}={d / folder}")]
    assert _select(corpus, d, tmp_path / "s", "--fields", f, "--keep", "1", scores=flags) == 2
    _one_line_error(capsys, repr(column), "case")


def test_field_columns_of_two_tables_equal_but_for_case_are_refused(world, tmp_path, capsys):
    corpus, d, j = world
    keys = sorted(j["key"].unique())
    (tmp_path / "fields").mkdir()
    _fields(tmp_path / "fields", "a", {"key": keys[:12], "q": [1.0] * 12})
    _fields(tmp_path / "fields", "b", {"key": keys[12:], "Q": [1.0] * 12})
    assert _select(corpus, d, tmp_path / "s", "--fields", str(tmp_path / "fields"), "--keep", "1") == 2
    _one_line_error(capsys, "'Q'", "'q'")


def test_check_namespace_is_the_one_rule():
    check_namespace([("judge", "a"), ("clip", "b"), ("keys", "c"), ("parts", "d"), ("u0", "e")])
    for names, why in (([("key", "x")], "reserved"), ([("a", "x"), ("A", "y")], "differ only in case"),
                       ([("a", "x"), ("a", "y")], "the same name"), ([("_Excluded", "x")], "reserved")):
        with pytest.raises(SelectError, match=why):
            check_namespace(names)


def test_user_names_never_shadow_internal_columns(world, tmp_path):
    """Field columns spelled like the SQL's own internal names (u0, c0, s0, f, score, excluded) are plain user
    columns: the selection keeps exactly the units a pandas computation keeps."""
    corpus, d, j = world
    keys = sorted(j["key"].unique())
    vals = {k: i for i, k in enumerate(keys)}
    f = _fields(tmp_path, "f", {"key": keys, "u0": [vals[k] for k in keys], "c0": [100 - vals[k] for k in keys],
                                "s0": [-1.0] * len(keys), "f": [0] * len(keys), "excluded": [1] * len(keys)})
    where = "u0 >= 6 and c0 > 90 and s0 < 0 and f == 0 and excluded == 1 and judge >= 0"
    want = {(k, s) for k, s in zip(j["key"], j["sentence_index"]) if vals[k] >= 6 and 100 - vals[k] > 90}
    assert 0 < len(want) < len(j)
    for engine, extra in (("mem", []), ("ooc", ["--keys-only"])):
        assert _select(corpus, d, tmp_path / engine, "--fields", f, "--where", where, "--keep", "1", *extra) == 0
        assert _kept(tmp_path / engine) == want
    # ranked by a field named like the internal 'score': the top 3 by u0 among the passing units
    assert _select(corpus, d, tmp_path / "r", "--fields", f, "--where", "u0 >= 0", "--rank", "u0",
                   "--top-k", "3", "--unit", "caption") == 0
    assert {k for k, _ in _kept(tmp_path / "r")} == set(keys[-3:])


@pytest.mark.parametrize("lit,keeps_all", [("1e999", True), ("-1e999", False), ("1E400", True), ("2e308", True)])
def test_infinite_literals_are_numbers_not_columns(world, tmp_path, lit, keeps_all):
    """A table with columns 'inf' and 'infinity' (all 0) must not turn `judge < 1e999` into `judge < inf`."""
    corpus, d, j = world
    keys = sorted(j["key"].unique())
    f = _fields(tmp_path, "f", {"key": keys, "inf": [-5.0] * len(keys), "infinity": [-5.0] * len(keys)})
    code = _select(corpus, d, tmp_path / "s", "--fields", f, "--where", f"judge < {lit}", "--keep", "1")
    if keeps_all:
        assert code == 0 and len(_kept(tmp_path / "s")) == len(j)
    else:
        assert code == 0 and _kept(tmp_path / "s") == set()


def test_literal_sql_forms():
    assert "CAST('inf' AS DOUBLE)" in parse("x < 1e999", "where").sql({"x": "x"})
    assert "CAST('inf' AS DOUBLE)" in parse("x > -1e999", "where").sql({"x": "x"})
    assert parse("x < 2.5", "where").sql({"x": "x"}) == "(x < CAST(2.5 AS DOUBLE))"
    for bad in ("x < 99999999999999999999", "x > " + "9" * 5000):
        with pytest.raises(SelectError, match="out of range|not an expression|characters"):
            parse(bad, "where")


# ---------------------------------------------------------------- missing values
@pytest.fixture()
def nan_fields(world, tmp_path):
    """Field q: NaN for every third key, else the key's index; r: NaN in a float32 column for every fourth."""
    corpus, d, j = world
    keys = sorted(j["key"].unique())
    q = [math.nan if i % 3 == 0 else float(i) for i in range(len(keys))]
    r = pa.array([math.nan if i % 4 == 0 else 1.0 for i in range(len(keys))], pa.float32())
    f = _fields(tmp_path, "f", {"key": keys, "q": q, "r": r})
    return f, dict(zip(keys, q)), dict(zip(keys, r.to_pylist()))


@pytest.mark.parametrize("where", ["q > 1000", "q != 5", "q == q", "not (q < 1)", "q >= -1e999", "r != 0",
                                   "q in (1, 2, 4)", "q not in (1, 2)", "q + 1 > 0 or r == 1"])
def test_nan_satisfies_no_comparison_in_both_engines(world, nan_fields, tmp_path, where):
    corpus, d, j = world
    f, q, r = nan_fields
    df = j.assign(q=j["key"].map(q), r=j["key"].map(r))
    # pandas evaluates with NaN as missing: a comparison with NaN is False, `not` of it kept False (SQL's unknown)
    mask = {"q > 1000": df.q > 1000, "q != 5": df.q.notna() & (df.q != 5), "q == q": df.q.notna(),
            "not (q < 1)": df.q.notna() & ~(df.q < 1), "q >= -1e999": df.q.notna(), "r != 0": df.r.notna(),
            "q in (1, 2, 4)": df.q.isin([1, 2, 4]), "q not in (1, 2)": df.q.notna() & ~df.q.isin([1, 2]),
            "q + 1 > 0 or r == 1": (df.q + 1 > 0) | (df.r == 1)}[where]
    want = set(zip(df[mask]["key"], df[mask]["sentence_index"]))
    for engine, extra in (("mem", []), ("ooc", ["--keys-only"])):
        assert _select(corpus, d, tmp_path / engine, "--fields", f, "--where", where, "--keep", "1", *extra) == 0
        assert _kept(tmp_path / engine) == want, (engine, where)


@pytest.mark.parametrize("rank,k", [("q", 5), ("q * 2 - r", 7), ("0 - q", 4)])
def test_nan_ranks_last_in_both_engines(world, nan_fields, tmp_path, rank, k):
    corpus, d, j = world
    f, q, r = nan_fields
    val = {key: eval(rank, {}, {"q": q[key], "r": r[key]}) for key in q}  # the test's own arithmetic
    ok = sorted((v, key) for key, v in val.items() if not math.isnan(v))
    want = {key for _, key in ok[-k:]}
    for engine, extra in (("mem", []), ("ooc", ["--keys-only"])):
        out = tmp_path / engine
        assert _select(corpus, d, out, "--fields", f, "--rank", rank, "--top-k", str(k), "--unit", "caption",
                       *extra) == 0
        assert {key for key, _ in _kept(out)} == want
        acc = json.loads((out / "manifest.json").read_text())["composition"]
        assert acc["rank_missing"] == sum(math.isnan(v) for v in val.values())


# ---------------------------------------------------------------- bounded work
@pytest.mark.parametrize("text,why", [
    (" and ".join(f"judge > {i}" for i in range(3000)), "characters|too large|clauses"),
    (" and ".join("judge>1" for _ in range(MAX_CLAUSES + 1)), "clauses"),
    ("-" * 5000 + "judge > 1", "nested too deeply"),
    ("not " * 4000 + "judge", "nested too deeply"),
    ("judge" + "+judge" * 2000 + " > 1", "nested too deeply|too large"),
    ("(" * 5000 + "judge" + ")" * 5000, "nested too deeply|characters"),
    ("-" * (MAX_DEPTH + 1) + "judge > 1", "nested too deeply"),
    ("judge in (" + ", ".join(map(str, range(5000))) + ")", "too large|characters"),
])
def test_oversized_expressions_are_refused_in_one_line(world, tmp_path, capsys, text, why):
    import re
    corpus, d, _ = world
    assert _select(corpus, d, tmp_path / "s", "--where", text, "--keep", "1") == 2
    err = _one_line_error(capsys, "--where")
    assert re.search(why, err) and len(err) < 400, err
    assert not (tmp_path / "s").exists() or not (tmp_path / "s" / "kept.parquet").exists()


def test_many_clauses_run_and_are_accounted(world, tmp_path):
    """MAX_CLAUSES clauses (the most allowed) run; the accounting is exact for each (removed, removed only)."""
    corpus, d, j = world
    n = MAX_CLAUSES
    clauses = [f"judge >= {i % 50}" for i in range(n - 1)] + ["clip >= 0"]
    assert _select(corpus, d, tmp_path / "s", "--where", " and ".join(clauses), "--keep", "1") == 0
    acc = json.loads((tmp_path / "s" / "manifest.json").read_text())["composition"]
    assert len(acc["clauses"]) == n and len(acc["overlaps"]) == 16 * 15 // 2
    judge = j["score"].to_numpy()
    for i, c in enumerate(acc["clauses"][:-1]):
        assert c["removed"] == int((judge < i % 50).sum())
        assert c["removed_only"] == 0  # judge >= 49 is another clause: no one clause removes a unit alone
    assert acc["passed"] == int((judge >= 49).sum()) == len(_kept(tmp_path / "s"))


def test_depth_just_within_the_limit_runs(world, tmp_path):
    corpus, d, j = world
    text = "-" * (MAX_DEPTH - 3) + "judge <= 100"  # an even count of minus signs: judge itself
    assert _select(corpus, d, tmp_path / "s", "--where", text, "--keep", "1") == 0
    want = {(k, s) for k, s, v in zip(j["key"], j["sentence_index"], j["score"]) if (-1) ** (MAX_DEPTH - 3) * v <= 100}
    assert _kept(tmp_path / "s") == want

