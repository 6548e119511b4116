"""Regression tests from the reliability probes (issues 19 and 35), by stage: `halsift score` under bad or changed
input: stale parts rescored, damage counted, one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_cases import _err_line, _score, _select, scored
from filtering_data import make_bench, make_corpus

from halsift.corpus.scores import read_scores_df
from halsift.launch.cli import main


# ------------------------------------------------------------------------------- 1. stale scores after the data changed
def test_rerun_after_shards_replaced_at_same_paths_rescores(tmp_path):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=5, seed=0)
    assert _score(data, tmp_path / "s") == 0
    other = make_corpus(tmp_path / "other", shards=2, per_shard=5, seed=7)
    for f in other.iterdir():  # another corpus at the same paths
        shutil.copy(f, data / f.name)
    assert _score(data, tmp_path / "s") == 0
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["parts_resumed"] == 0 and m["sentences_scored_this_run"] == m["sentences"] > 0
    assert set(read_scores_df(tmp_path / "s")["key"]) == {f"s7_{i:05d}" for i in range(10)}
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--keep", "0.3", "--no-progress"]) == 0
    sel = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert sel["precision"]["kept"] == 100.0 and sel["keys"]["only_in_scores"] == 0
    assert _score(data, tmp_path / "s") == 0  # unchanged now: reused
    assert json.loads((tmp_path / "s" / "_manifest.json").read_text())["parts_resumed"] == 2


def test_rerun_after_detector_checkpoint_changed_rescores(tmp_path):
    from halsift.filtering.detectors.clip import ClipDetector
    from halsift.training.clip_train import save_state_dict_safetensors

    data = make_corpus(tmp_path / "c", shards=2, per_shard=3)
    ckpt = tmp_path / "model.safetensors"
    save_state_dict_safetensors(ClipDetector(arch="halsift-tiny", pretrained="random", seed=1).model, ckpt)
    spec = f"clip:arch=halsift-tiny,checkpoint={ckpt}"
    assert _score(data, tmp_path / "s", spec) == 0
    first = read_scores_df(tmp_path / "s").sort_values(["key", "sentence_index"])["score"].to_numpy()
    retrained = ClipDetector(arch="halsift-tiny", pretrained="random", seed=2)
    save_state_dict_safetensors(retrained.model, ckpt)  # retrained in place
    assert _score(data, tmp_path / "s", spec) == 0
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["parts_resumed"] == 0 and m["sentences_scored_this_run"] == m["sentences"]
    again = read_scores_df(tmp_path / "s").sort_values(["key", "sentence_index"])["score"].to_numpy()
    assert len(again) == len(first) and (again != first).any()


# ------------------------------------------------------------------------------- 5. honest counts, incomplete inputs
def test_truncated_shard_counts_the_samples_it_lost(tmp_path):
    from halsift.corpus.shards import ShardFormatError, iter_shard

    data = make_corpus(tmp_path / "c", shards=1, per_shard=12, seed=4)
    tar = data / "000000.tar"
    raw = tar.read_bytes()
    tar.write_bytes(raw[: len(raw) // 3 + 100])
    read = []
    with pytest.raises(ShardFormatError, match=r"000000\.tar: truncated or corrupt tar after sample s4_\d+ "
                                               r"\(.*\); \d+ sample\(s\) lost$"):
        for s in iter_shard(tar):
            read.append(s.key)
    assert _score(data, tmp_path / "s") == 0
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"corrupt_shard": 12 - len(read)} and 12 - len(read) > 1
    assert "sample(s) lost" in m["skipped"]["samples"][0]["reason"]


# ------------------------------------------------------------------------------- every user error: one line, exit 2
def test_corrupt_parquet_part_is_one_line_and_a_rerun_rescores_it(scored, tmp_path, capsys):
    data, rand = scored
    part = rand / "part-000000.parquet"
    part.write_bytes(part.read_bytes()[:50])
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel") == 2
    line = _err_line(capsys)
    assert str(part) in line and "not a readable parquet" in line and not (tmp_path / "sel").exists()
    bench = make_bench(tmp_path / "b", captions=3)
    assert main(["eval", "bench", "--bench", str(bench), "--scores", str(rand), "--out", str(tmp_path / "ev")]) == 2
    assert str(part) in _err_line(capsys)
    assert _score(data, rand, "random:seed=1") == 0  # the rerun rescores the damaged part
    m = json.loads((rand / "_manifest.json").read_text())
    assert m["parts_resumed"] == 1 and len(read_scores_df(rand)) == m["sentences"]


def test_write_part_atomic_removes_its_temp_file_on_failure(tmp_path, monkeypatch):
    import errno

    import pyarrow.parquet as pq

    from halsift.corpus.scores import scores_table, write_part_atomic

    def full(table, where, *a, **kw):
        Path(where).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    with pytest.raises(OSError, match="No space left on device"):
        write_part_atomic(scores_table(["a"], [0], [1.0], [True], "x"), tmp_path / "part-a.parquet")
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_file_is_one_line(tmp_path, capsys):
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    (tmp_path / "file").write_text("not a folder")
    assert _score(data, tmp_path / "file") == 2
    line = _err_line(capsys)
    assert line.startswith(f"halsift score: error: {tmp_path / 'file'}: ") and "Traceback" not in line
    assert (tmp_path / "file").read_text() == "not a folder"


def test_bench_given_as_a_folder_and_caption_unit_on_a_bench_are_one_line(tmp_path, capsys):
    bench = make_bench(tmp_path / "b", captions=3)
    assert main(["eval", "bench", "--bench", str(tmp_path / "b"), "--detector", "oracle",
                 "--out", str(tmp_path / "ev")]) == 2
    assert str(tmp_path / "b") in _err_line(capsys)
    assert _score(bench, tmp_path / "s", "oracle", "--unit", "caption") == 2
    line = _err_line(capsys)
    assert line.startswith("halsift score: error: --unit: ") and "is scored per sentence" in line
    assert not (tmp_path / "s").exists()


def test_fifo_image_in_a_bench_is_skipped_not_waited_for(tmp_path):
    import os

    bench = make_bench(tmp_path / "b", captions=3)
    img = tmp_path / "b" / "images" / "im1.png"
    img.unlink()
    os.mkfifo(img)
    assert _score(bench, tmp_path / "s") == 0
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"missing_image": m["skipped"]["total"]} and m["skipped"]["total"] >= 1
    assert "not a regular file" in m["skipped"]["samples"][0]["reason"]


def test_fifo_shard_is_refused(tmp_path, capsys):
    import os

    (tmp_path / "c").mkdir()
    os.mkfifo(tmp_path / "c" / "000000.tar")
    assert _score(tmp_path / "c", tmp_path / "s") == 2
    assert "not a regular file" in _err_line(capsys)
