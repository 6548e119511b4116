"""Issue 35 (select side): nothing silently wrong in `halsift select`, whichever engine runs it. A key repeated in a
shard is skipped and counted; shards replaced since scoring and parts altered or swapped are refused; every flag is
honoured or refused; --out apart from --scores and the input shards. Each case runs both engines (in memory and
--resumable) and expects the same outcome."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from filtering_data import make_corpus, restamp

from halsift.corpus.shards import iter_samples
from halsift.filtering.scoring.runner import score
from halsift.launch.cli import main

ENGINES = {"memory": [], "resumable": ["--resumable"]}


def _select(scores, data, out, *extra) -> int:
    return main(["select", "--scores", str(scores), "--data", str(data), "--out", str(out), "--no-progress", *extra])


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _write_tar(path: Path, samples) -> None:
    """A shard holding ``samples`` in this order (repeated keys included: what ShardWriter refuses to write)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for s in samples:
            meta = {k: v for k, v in s.meta.items() if k != "key"}
            for name, data in ((f"{s.key}.{s.ext}", s.image), (f"{s.key}.txt", s.caption.encode()),
                               (f"{s.key}.json", json.dumps({**meta, "key": s.key}).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _with_repeated_key(tmp: Path):
    """A corpus whose shard 0 holds its 2nd sample again after its 4th, with other sentences: (corpus, the first
    occurrence)."""
    corpus = make_corpus(tmp / "c", shards=2, per_shard=6, seed=1)
    other = list(iter_samples(make_corpus(tmp / "o", shards=1, per_shard=6, seed=8)))
    samples = list(iter_samples(corpus / "000000.tar"))
    first = samples[1]
    meta = {**first.meta, "sentences": other[0].meta["sentences"]}
    again = type(first)(first.key, first.image, other[0].caption, meta, first.ext)
    _write_tar(corpus / "000000.tar", samples[:4] + [again] + samples[4:])
    return corpus, first


def _first_rows_only(scores: Path) -> Path:
    """The parts as a `halsift score` that skips a repeated key writes them: each (key, sentence_index) once, the
    first (the first occurrence's)."""
    for p in scores.glob("part-*.parquet"):
        t = pq.read_table(p)
        t = t.append_column("_row", pa.array(range(len(t))))
        first = t.group_by(["key", "sentence_index"], use_threads=False).aggregate([("_row", "min")])
        keep = pc.sort_indices(first["_row_min"])
        t = t.take(pc.take(first["_row_min"], keep)).drop_columns(["_row"])
        pq.write_table(t, p)
    return restamp(scores)


# ---------------------------------------------------------------------------------------------- 1. repeated keys
@pytest.mark.parametrize("unit", ["sentence", "caption"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_key_repeated_in_a_shard_is_skipped_counted_and_its_first_occurrence_selected(tmp_path, engine, unit,
                                                                                       capsys):
    corpus, first = _with_repeated_key(tmp_path)
    score("oracle", corpus, tmp_path / "s", show_progress=False)
    _first_rows_only(tmp_path / "s")
    out = tmp_path / "sel"
    assert _select(tmp_path / "s", corpus, out, "--threshold", "0", "--unit", unit, *ENGINES[engine]) == 0
    assert "1 sample(s) skipped (duplicate=1)" in capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"duplicate": 1} and m["skipped"]["samples"][0]["key"] == first.key
    written = list(iter_samples(out))
    assert len({s.meta.get("parent_key", s.key) for s in written}) == 12  # none lost after the repeated key
    texts = sorted(s.caption for s in written if s.meta.get("parent_key", s.key) == first.key)
    # the first occurrence's caption (or sentences), not the repeat's
    assert texts == ([first.caption] if unit == "caption" else sorted(x["text"] for x in first.meta["sentences"]))


@pytest.mark.parametrize("engine", list(ENGINES))
def test_scores_repeating_a_row_are_refused_the_same_by_both_engines(tmp_path, engine, capsys):
    """Scores whose part repeats a row (as the score of 31422d8 wrote for a key repeated in a shard; today's score
    skips the repeat, so the part is made by hand and recorded). Before, the resumable select wrote nothing of the
    shard after the repeated key and exited 0."""
    corpus, first = _with_repeated_key(tmp_path)
    score("oracle", corpus, tmp_path / "s", show_progress=False)
    part = tmp_path / "s" / "part-000000.parquet"
    t = pq.read_table(part)
    again = t.filter(pc.and_(pc.equal(t["key"], first.key), pc.equal(t["sentence_index"], 0)))
    assert len(again) == 1
    pq.write_table(pa.concat_tables([t, again]), part)  # that row twice
    restamp(tmp_path / "s")
    out = tmp_path / "sel"
    assert _select(tmp_path / "s", corpus, out, "--threshold", "0", *ENGINES[engine]) == 2
    line = _err_line(capsys)
    assert f"row (key={first.key!r}, sentence_index=0) appears more than once" in line and "part-000000.parquet" in line
    assert not out.exists()


# ---------------------------------------------------------------------------------------------- 2./3. stale inputs
@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    d = tmp_path_factory.mktemp("guard")
    corpus = make_corpus(d / "corpus", shards=2, per_shard=8, seed=3)
    score("oracle", corpus, d / "scores", show_progress=False)
    return corpus, d / "scores"


def _copy(scored, tmp: Path) -> tuple[Path, Path]:
    corpus, scores = scored
    shutil.copytree(corpus, tmp / "corpus")
    shutil.copytree(scores, tmp / "scores")
    return tmp / "corpus", tmp / "scores"


def _replace_contents_keep_keys(corpus: Path, tmp: Path) -> None:
    """Every shard rewritten at its path with the same keys but another corpus's captions and labels."""
    other = list(iter_samples(make_corpus(tmp / "other", shards=2, per_shard=8, seed=9)))
    for f in sorted(corpus.glob("*.tar")):
        mine = list(iter_samples(f))
        _write_tar(f, [type(s)(s.key, s.image, o.caption, {**s.meta, "sentences": o.meta["sentences"]}, s.ext)
                       for s, o in zip(mine, other)])
        other = other[len(mine):]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_shards_replaced_at_the_same_paths_are_refused(scored, tmp_path, engine, capsys):
    corpus, scores = _copy(scored, tmp_path)
    _replace_contents_keep_keys(corpus, tmp_path)
    out = tmp_path / "sel"
    assert _select(scores, corpus, out, "--keep", "0.5", *ENGINES[engine]) == 2
    line = _err_line(capsys)
    assert f"data: {corpus / '000000.tar'} is not the shard {scores / 'part-000000.parquet'} was scored from" in line
    assert not out.exists()


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_copy_of_the_shards_with_new_times_is_the_same_data(scored, tmp_path, engine):
    """The fingerprint check compares size and content, not modification times: copied shards are accepted."""
    corpus, scores = scored
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in corpus.iterdir():
        shutil.copy(f, copy / f.name)  # new mtimes
    assert _select(scores, copy, tmp_path / "sel", "--keep", "0.5", *ENGINES[engine]) == 0
    m = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert m["scores_check"]["shards_checked"] == 2 and m["precision"]["kept"] == 100.0


def _swap_parts(scores: Path) -> None:
    a, b = scores / "part-000000.parquet", scores / "part-000001.parquet"
    a.rename(scores / "tmp")
    b.rename(a)
    (scores / "tmp").rename(b)


def _flip_scores(scores: Path) -> None:
    p = scores / "part-000001.parquet"
    t = pq.read_table(p)  # keeps the part's own metadata (its source fingerprint)
    i = t.schema.get_field_index("score")
    pq.write_table(t.set_column(i, "score", pc.subtract(pa.scalar(100, pa.float32()), t["score"])), p)


@pytest.mark.parametrize("spoil, part", [(_swap_parts, "part-000000.parquet"), (_flip_scores, "part-000001.parquet")])
def test_an_altered_or_swapped_part_is_refused_by_both_engines(scored, tmp_path, spoil, part, capsys):
    corpus, scores = _copy(scored, tmp_path)
    spoil(scores)
    lines = []
    for engine, extra in ENGINES.items():
        assert _select(scores, corpus, tmp_path / engine, "--keep", "0.5", *extra) == 2
        lines.append(_err_line(capsys))
        assert not (tmp_path / engine).exists()
    assert lines[0] == lines[1] and f"scores: {scores / part} is not the part `halsift score` wrote" in lines[0]


def test_without_part_records_swapped_parts_are_refused_by_their_source_fingerprints(scored, tmp_path, capsys):
    """A score manifest from before part records: the parts' own source fingerprints still pair them with shards."""
    corpus, scores = _copy(scored, tmp_path)
    m = json.loads((scores / "_manifest.json").read_text())
    m.pop("part_records", None)
    (scores / "_manifest.json").write_text(json.dumps(m))
    assert _select(scores, corpus, tmp_path / "ok", "--keep", "0.5", "--resumable") == 0
    sel = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert sel["scores_check"]["parts_unrecorded"] == 2 and sel["scores_check"]["shards_checked"] == 2
    _swap_parts(scores)
    assert _select(scores, corpus, tmp_path / "sel", "--keep", "0.5", "--resumable") == 2
    assert f"data: {corpus / '000000.tar'} is not the shard" in _err_line(capsys)


# ---------------------------------------------------------------------------------------------- 4. every flag
def test_resumable_select_writes_the_page_and_the_key_list(scored, tmp_path, capsys):
    corpus, scores = scored
    out, keys = tmp_path / "sel", tmp_path / "keys.txt"
    assert _select(scores, corpus, out, "--keep", "0.5", "--resumable", "--html", "--export-keys", str(keys)) == 0
    assert (out / "index.html").is_file()
    kept = set(pq.read_table(out / "kept.parquet")["key"].to_pylist())
    assert keys.read_text().split() == sorted(kept) and kept
    assert f"wrote {len(kept)} keys -> {keys}" in capsys.readouterr().out


@pytest.mark.parametrize("extra, needle", [
    (["--resumable", "--maxcount", "2"], "--maxcount: --resumable writes one output shard per input shard"),
    (["--keys-only", "--html"], "--keys-only writes no shards; --html reads them"),
    (["--keys-only", "--export-keys", "k.txt"], "--keys-only writes no shards; --export-keys reads them"),
])
def test_a_flag_an_engine_cannot_honour_is_refused(scored, tmp_path, extra, needle, capsys):
    corpus, scores = scored
    assert _select(scores, corpus, tmp_path / "sel", "--keep", "0.5", *extra) == 2
    assert needle in _err_line(capsys)
    assert not (tmp_path / "sel").exists()


# ---------------------------------------------------------------------------------------------- 5. --out apart
@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("where, how", [(".", "is the score folder"), ("sel", "lies inside the score folder"),
                                        ("..", "contains the score folder")])
def test_out_may_not_be_contain_or_lie_inside_the_score_folder(scored, tmp_path, engine, where, how, capsys):
    corpus, _ = scored
    scores = tmp_path / "s" / "scores"
    shutil.copytree(scored[1], scores)
    before = {p.name: p.read_bytes() for p in scores.iterdir() if p.is_file()}
    out = (scores / where) if where != "." else scores
    assert _select(scores, corpus, out, "--keep", "0.5", *ENGINES[engine]) == 2
    assert how in _err_line(capsys)
    assert {p.name: p.read_bytes() for p in scores.iterdir() if p.is_file()} == before
    assert main(["select", "--scores", str(scores), "--data", str(corpus), "--out", str(tmp_path / "ok"), "--keep",
                 "0.5", "--no-progress", *ENGINES[engine]]) == 0  # the score folder still selects


@pytest.mark.parametrize("engine", list(ENGINES))
def test_out_may_not_hold_an_input_shard(scored, tmp_path, engine, capsys):
    corpus, scores = scored
    shutil.copytree(corpus, tmp_path / "data" / "corpus")
    assert _select(scores, tmp_path / "data" / "corpus", tmp_path / "data", "--keep", "0.5", *ENGINES[engine]) == 2
    assert f"holds the input shard {tmp_path / 'data' / 'corpus' / '000000.tar'}" in _err_line(capsys)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["corpus"]
