"""Regression tests from the reliability probes (issues 19 and 35), by stage: `halsift select` validates its inputs and
skips bad samples one by one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_cases import _err_line, _score, _select, scored
from filtering_data import restamp

from halsift.corpus.scores import read_scores_df
from halsift.launch.cli import main


def test_select_refuses_a_foreign_part(scored, tmp_path, capsys):
    data, rand = scored
    assert _score(data, tmp_path / "oracle") == 0
    shutil.copy(tmp_path / "oracle" / "part-000000.parquet", rand / "part-000000.parquet")
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel") == 2
    line = _err_line(capsys)
    assert "part-000000.parquet" in line and "'oracle'" in line and "foreign" in line
    assert not (tmp_path / "sel").exists()
    # a part file the manifest does not list
    shutil.copy(tmp_path / "oracle" / "part-000000.parquet", rand / "part-extra.parquet")
    assert _select(rand, data, tmp_path / "sel", "--detector", "oracle") == 2
    assert "part-extra.parquet" in _err_line(capsys)


def test_select_refuses_partial_scores_unless_allowed(scored, tmp_path, capsys):
    data, rand = scored
    m = json.loads((rand / "_manifest.json").read_text())
    (rand / "_manifest.json").write_text(json.dumps({**m, "status": "running"}))  # what a killed score leaves
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel") == 2
    line = _err_line(capsys)
    assert "_manifest.json" in line and "'running'" in line and "--allow-partial" in line
    assert not (tmp_path / "sel").exists()
    assert _select(rand, data, tmp_path / "sel", "--allow-partial") == 0
    sel = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert sel["status"] == "complete" and sel["filter"]["allow_partial"] is True
    assert sel["filter"]["scores_status"] == "running"


def test_select_refuses_duplicate_rows_and_indices_out_of_range(scored, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, rand = scored
    part = rand / "part-000001.parquet"
    t = pq.read_table(part)
    pq.write_table(pa.concat_tables([t, t.slice(0, 1)]), part)
    restamp(rand)  # edited on purpose: recorded, as `halsift score` records its parts
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel") == 2
    line = _err_line(capsys)
    assert "part-000001.parquet" in line and "more than once" in line
    # an index past the caption's sentences (scores made from other shards)
    idx = t["sentence_index"].to_pylist()
    pq.write_table(t.set_column(1, "sentence_index", pa.array([40] + idx[1:], pa.int32())), part)
    restamp(rand)  # edited on purpose: recorded, as `halsift score` records its parts
    assert main(["select", "--scores", str(rand), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--threshold", "0", "--no-progress"]) == 2
    line = _err_line(capsys)
    assert "part-000001.parquet" in line and "sentence_index 40" in line
    assert not (tmp_path / "sel").exists()


def test_int64_sentence_index_part_is_read(scored, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, rand = scored
    part = rand / "part-000001.parquet"
    t = pq.read_table(part)
    pq.write_table(t.set_column(1, "sentence_index", t["sentence_index"].cast(pa.int64())), part)
    restamp(rand)  # edited on purpose: recorded, as `halsift score` records its parts
    assert _select(rand, data, tmp_path / "sel") == 0
    assert json.loads((tmp_path / "sel" / "manifest.json").read_text())["candidates"] == len(read_scores_df(rand))
    from halsift.corpus.scores import read_scores  # what eval bench and the ensembles read

    assert read_scores(rand)["sentence_index"].type == pa.int32()


# ------------------------------------------------------------------------------- 4. bad samples are skipped one by one
def _write_tar(path: Path, samples: list[tuple[str, bytes, str, dict]]) -> None:
    """A shard written by hand (the ShardWriter refuses such keys)."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for key, image, caption, meta in samples:
            for ext, data in (("png", image), ("txt", caption.encode()), ("json", json.dumps(meta).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_select_skips_a_rejected_key_and_keeps_the_rest_of_its_shard(tmp_path, capsys):
    import random

    from filtering_data import png

    from halsift.corpus.shards import iter_samples

    rng = random.Random(0)
    (tmp_path / "c").mkdir()
    keys = ["a_000", "pwned_key)", "a_002", "a_003"]
    _write_tar(tmp_path / "c" / "000000.tar", [
        (k, png(rng), f"A red dog number {i}.", {"captioner": "capA", "source": "i2t",
                                                  "sentences": [{"text": f"A red dog number {i}.", "label": "correct"}]})
        for i, k in enumerate(keys)])
    assert _score(tmp_path / "c", tmp_path / "s") == 0
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(tmp_path / "c"), "--out",
                 str(tmp_path / "sel"), "--keep", "1", "--unit", "caption", "--no-progress"]) == 0
    m = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"bad_sample": 1} and m["skipped"]["samples"][0]["key"] == "pwned_key)"
    assert m["corrupt_shards"] == [] and m["samples_written"] == 3
    assert [s.key for s in iter_samples(tmp_path / "sel")] == ["a_000", "a_002", "a_003"]
    assert "1 sample(s) skipped" in capsys.readouterr().out


def test_full_disk_during_select_is_one_line_and_leaves_no_temp_shard(scored, tmp_path, monkeypatch, capsys):
    import errno
    import tarfile

    data, rand = scored
    real = tarfile.TarFile.addfile
    calls = [0]

    def addfile(self, *a, **kw):
        calls[0] += 1
        if calls[0] > 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **kw)

    monkeypatch.setattr(tarfile.TarFile, "addfile", addfile)
    (tmp_path / "sel").mkdir()  # an existing, empty --out: kept, emptied of what the run wrote
    assert _select(rand, data, tmp_path / "sel") == 2
    assert "No space left on device" in _err_line(capsys)
    assert list((tmp_path / "sel").iterdir()) == []


@pytest.mark.parametrize("value", ["200", "nan", "-1"])
def test_select_threshold_outside_0_100_is_refused(scored, tmp_path, capsys, value):
    data, rand = scored
    capsys.readouterr()
    assert main(["select", "--scores", str(rand), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--threshold", value, "--no-progress"]) == 2
    assert "--threshold" in _err_line(capsys) and not (tmp_path / "sel").exists()
