"""Composed selection: several named score folders, field tables and exclusions under a --where expression, ranked by
--rank; the same units in both engines; the accounting of what each clause removed; errors in one line."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from filtering_data import judge_and_clip

from halsift.corpus.scores import read_scores_df
from halsift.filtering.selection.expression import parse
from halsift.filtering.selection.score_folder import SelectError
from halsift.launch.cli import main

WHERE = "judge >= 50 and clip >= 30 and lang == 'en'"


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """24 samples scored by oracle ('judge') and random ('clip'); a field table (lang by key); 2 excluded keys."""
    d = tmp_path_factory.mktemp("compose")
    corpus = judge_and_clip(d)
    keys = sorted(read_scores_df(d / "judge")["key"].unique())
    (d / "fields").mkdir()
    langs = ["en" if i % 4 else "de" for i in range(len(keys))]
    pq.write_table(pa.table({"key": keys[:12], "lang": langs[:12], "words": list(range(12))}),
                   d / "fields" / "part-a.parquet")
    pq.write_table(pa.table({"key": keys[12:], "lang": langs[12:], "words": list(range(12, 24))}),
                   d / "fields" / "part-b.parquet")
    (d / "drop.txt").write_text(f"{keys[1]}\n\n{keys[2]}\n")
    return corpus, d, keys


def _table(d) -> pd.DataFrame:
    """Every sentence unit with its judge and clip scores, its key's lang and whether the key is excluded."""
    j = read_scores_df(d / "judge")[["key", "sentence_index", "score"]].rename(columns={"score": "judge"})
    c = read_scores_df(d / "clip")[["key", "sentence_index", "score"]].rename(columns={"score": "clip"})
    f = pd.concat([pq.read_table(p).to_pandas() for p in sorted((d / "fields").glob("*.parquet"))])
    t = j.merge(c, on=["key", "sentence_index"]).merge(f, on="key", how="left")
    drop = set((d / "drop.txt").read_text().split())
    t["excluded"] = t["key"].isin(drop)
    return t[t["sentence_index"] >= 0]


def _kept(out) -> set:
    k = pq.read_table(out / "kept.parquet").to_pandas()
    return set(zip(k["key"], k["sentence_index"]))


def _args(corpus, d, out, *extra):
    return ["select", "--scores", f"judge={d / 'judge'}", "--scores", f"clip={d / 'clip'}", "--fields",
            str(d / "fields"), "--exclude", str(d / "drop.txt"), "--data", str(corpus), "--out", str(out),
            "--no-progress", *extra]


def test_where_keeps_exactly_the_passing_units_in_both_engines(scored, tmp_path, capsys):
    corpus, d, _ = scored
    t = _table(d)
    ok = {"judge": t["judge"] >= 50, "clip": t["clip"] >= 30, "lang": t["lang"] == "en", "excl": ~t["excluded"]}
    passing = t[ok["judge"] & ok["clip"] & ok["lang"] & ok["excl"]]
    want = set(zip(passing["key"], passing["sentence_index"]))
    assert 0 < len(want) < len(t)
    assert main(_args(corpus, d, tmp_path / "mem", "--where", WHERE, "--keep", "1")) == 0
    assert main(_args(corpus, d, tmp_path / "ooc", "--where", WHERE, "--keep", "1", "--keys-only")) == 0
    assert _kept(tmp_path / "mem") == want == _kept(tmp_path / "ooc")
    for engine in ("mem", "ooc"):
        acc = json.loads((tmp_path / engine / "manifest.json").read_text())["composition"]
        assert acc["units"] == len(t) and acc["passed"] == acc["candidates"] == len(want)
        names = ["judge >= 50", "clip >= 30", "lang == 'en'", "not excluded"]
        fails = [~ok["judge"], ~ok["clip"], ~ok["lang"], ~ok["excl"]]
        assert [c["clause"] for c in acc["clauses"]] == names
        for c, f in zip(acc["clauses"], fails):
            others = pd.concat([g for g in fails if g is not f], axis=1).any(axis=1)
            assert (c["removed"], c["removed_only"]) == (int(f.sum()), int((f & ~others).sum()))
        pairs = {tuple(o["clauses"]): o["removed"] for o in acc["overlaps"]}
        assert len(pairs) == 6 and pairs[("judge >= 50", "clip >= 30")] == int((fails[0] & fails[1]).sum())
    out = capsys.readouterr().out
    assert f"composed: {len(want)} of {len(t)} units pass where {WHERE}" in out
    assert "not excluded: removes" in out


def test_rank_and_top_k(scored, tmp_path):
    corpus, d, _ = scored
    t = _table(d)
    passing = t[(t["lang"] == "en") & ~t["excluded"]].copy()
    passing["r"] = passing["judge"] + 2 * passing["clip"]
    top = passing.sort_values("r", ascending=False).head(5)
    assert passing["r"].nlargest(6).iloc[-1] < top["r"].min()  # no tie at the cut
    assert main(_args(corpus, d, tmp_path / "s", "--where", "lang in ('en',)", "--rank", "judge + 2 * clip",
                      "--top-k", "5")) == 0
    assert _kept(tmp_path / "s") == set(zip(top["key"], top["sentence_index"]))
    kept = pq.read_table(tmp_path / "s" / "kept.parquet").to_pandas()
    assert sorted(kept["score"]) == pytest.approx(sorted(top["r"]))


def test_caption_unit_same_in_both_engines(scored, tmp_path):
    corpus, d, _ = scored
    t = _table(d)
    cap = t.groupby("key").agg(judge=("judge", "min"), clip=("clip", "min"), lang=("lang", "first"),
                               excluded=("excluded", "first"))
    want = set(cap[(cap["judge"] >= 50) & (cap["clip"] >= 30) & (cap["lang"] == "en") & ~cap["excluded"]].index)
    for name, extra in (("mem", []), ("ooc", ["--resumable"])):
        assert main(_args(corpus, d, tmp_path / name, "--where", WHERE, "--keep", "1", "--unit", "caption",
                          *extra)) == 0
        assert {k for k, _ in _kept(tmp_path / name)} == want


def test_single_scores_folder_with_exclude_and_its_names(scored, tmp_path):
    corpus, d, keys = scored
    dup = tmp_path / "dedup"
    dup.mkdir()
    pq.write_table(pa.table({"key": [keys[0], keys[5]], "group": [0, 1], "reason": ["exact", "eval"],
                             "matched": [keys[3], "coco:1"], "similarity": [1.0, 0.97]}), dup / "duplicates.parquet")
    assert main(["select", "--scores", str(d / "judge"), "--data", str(corpus), "--out", str(tmp_path / "s"),
                 "--exclude", str(dup), "--where", "score >= 0 and oracle >= 0", "--keep", "1", "--no-progress"]) == 0
    kept_keys = {k for k, _ in _kept(tmp_path / "s")}
    assert kept_keys == set(keys) - {keys[0], keys[5]}


def test_unknown_name_and_bad_expressions_exit_2(scored, tmp_path, capsys):
    corpus, d, _ = scored
    assert main(_args(corpus, d, tmp_path / "s", "--where", "judge >= 60 and clipp > 2")) == 2
    err = capsys.readouterr().err.strip()
    assert "--where: 'clipp' is not a score or field here; available: judge, clip, lang, words" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "s").exists()
    assert main(_args(corpus, d, tmp_path / "s", "--where", "__import__('os').system('true')")) == 2
    assert "Call is not allowed" in capsys.readouterr().err
    assert main(_args(corpus, d, tmp_path / "s", "--where", "lang >= 3", "--keep", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert "DuckDB could not evaluate" in err and len(err.splitlines()) == 1
    assert main(["select", "--scores", f"judge={d / 'judge'}", "--scores", str(d / "clip"), "--data", str(corpus),
                 "--out", str(tmp_path / "s"), "--no-progress"]) == 2
    assert "name every folder" in capsys.readouterr().err
    assert main(_args(corpus, d, tmp_path / "s", "--exclude", str(tmp_path / "nope.txt"))) == 2
    assert "nope.txt is not a file" in capsys.readouterr().err


def test_plain_select_unchanged(scored, tmp_path):
    corpus, d, _ = scored
    assert main(["select", "--scores", str(d / "judge"), "--data", str(corpus), "--out", str(tmp_path / "s"),
                 "--keep", "0.5", "--no-progress"]) == 0
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert "composition" not in m and "compose" not in m["filter"]


def test_expression_whitelist_and_sql():
    e = parse("judge >= 60 and not (clip < 2.5 or lang in ('en', 'de')) and 1 < words <= 9", "where")
    cols = {"judge": '"judge"', "clip": '"clip"', "lang": '"lang"', "words": '"words"'}
    assert e.names == ["clip", "judge", "lang", "words"]
    assert [t for t, _ in e.clauses()] == ["judge >= 60", "not (clip < 2.5 or lang in ('en', 'de'))",
                                           "1 < words <= 9"]
    assert e.sql(cols) == ('(("judge" >= 60) AND (NOT (("clip" < CAST(2.5 AS DOUBLE)) OR ("lang" IN (\'en\', '
                           '\'de\')))) AND ((1 < "words") AND ("words" <= 9)))')
    assert parse("a / b", "rank").sql({"a": "a", "b": "b"}) == "(CAST(a AS DOUBLE) / NULLIF(CAST(b AS DOUBLE), 0))"
    assert parse("x == 'it''s'".replace("''", "\\'"), "where").sql({"x": "x"}) == "(x = 'it''s')"
    for bad, why in (("a.b > 1", "Attribute"), ("f(x)", "Call"), ("x[0]", "Subscript"), ("lambda: 1", "Lambda"),
                     ("x in y", "needs a list"), ("(1, 2)", "only allowed after")):
        with pytest.raises(SelectError, match=why):
            parse(bad, "where")


def test_html_page_shows_each_clause(scored, tmp_path):
    corpus, d, _ = scored
    assert main(_args(corpus, d, tmp_path / "s", "--where", WHERE, "--keep", "1", "--html")) == 0
    page = (tmp_path / "s" / "index.html").read_text()
    acc = json.loads((tmp_path / "s" / "manifest.json").read_text())["composition"]
    assert "<h2>Composed selection</h2>" in page and f"What each clause removed (of {acc['units']} units)" in page
    judge = acc["clauses"][0]
    assert (f'<th scope="row">judge &gt;= 50</th><td>{judge["removed"]}</td>' in page
            and "Removed by two clauses" in page and f"<td>{acc['passed']}</td>" in page)
