"""dedup refuses the nonsense that removes everything (issue 41): --against overlapping the corpus's own shards, a
result listing more than half the corpus as leaks or duplicates (unless --allow-implausible), an --out folder of
another stage; each in one line, exit 2, before anything is overwritten."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest
from file_ids import file_ids
from test_dedup import M, _corpus, _png

from halsift.corpus.shards import Sample, ShardWriter
from halsift.filtering.curation.dedup import MAX_SHARE, DedupError, check_share
from halsift.launch.cli import main


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def _dedup(data, out, *extra):
    return main(["dedup", "--data", str(data), "--out", str(out), "--no-progress", *extra])


@pytest.mark.parametrize("how", ["folder", "symlink", "glob", "hardlink"])
def test_against_the_corpus_own_shards_is_refused(tmp_path, capsys, how):
    data = _corpus(tmp_path)
    shards = sorted(data.glob("*.tar"))
    if how == "folder":
        against = str(data)
    elif how == "symlink":  # an evaluation folder with a link to the corpus's last shard
        (tmp_path / "evalset").mkdir()
        (tmp_path / "evalset" / "000009.tar").symlink_to(shards[-1])
        against = str(tmp_path / "evalset")
    elif how == "glob":
        against = str(data / "*.tar")
    else:  # the same file under another name
        (tmp_path / "evalset").mkdir()
        os.link(shards[0], tmp_path / "evalset" / "000000.tar")
        against = str(tmp_path / "evalset")
    assert _dedup(data, tmp_path / "d", "--against", against) == 2
    err = _err(capsys)
    assert "--against" in err and "corpus's own shard" in err
    assert not (tmp_path / "d" / "duplicates.parquet").exists()


def test_a_copy_of_the_corpus_as_against_is_an_implausible_share(tmp_path, capsys):
    """A byte copy (other files, so not caught as the same shards) lists every sample as a leak: refused by the
    share rule; --allow-implausible writes it."""
    data = _corpus(tmp_path)
    shutil.copytree(data, tmp_path / "copy")
    assert _dedup(data, tmp_path / "d", "--against", str(tmp_path / "copy")) == 2
    err = _err(capsys)
    assert "evaluation leaks" in err and "--allow-implausible" in err and "implausible" in err
    assert not (tmp_path / "d" / "duplicates.parquet").exists()
    assert _dedup(data, tmp_path / "d", "--against", str(tmp_path / "copy"), "--allow-implausible") == 0
    rows = pq.read_table(tmp_path / "d" / "duplicates.parquet").to_pylist()
    assert sum(r["reason"] == "eval" for r in rows) > MAX_SHARE * 24


def test_mostly_duplicates_is_refused_unless_allowed(tmp_path, capsys):
    """9 of 10 samples are byte copies of the first: 90% duplicates."""
    with ShardWriter(tmp_path / "c", maxcount=100) as w:
        for i in range(10):
            w.write(Sample(f"k{i}", _png(0), f"Caption {i}.", dict(M), ext="png"))
    assert _dedup(tmp_path / "c", tmp_path / "d") == 2
    assert "9 of 10 samples (90%) would be listed as duplicates" in _err(capsys)
    assert _dedup(tmp_path / "c", tmp_path / "d", "--allow-implausible") == 0
    assert len(pq.read_table(tmp_path / "d" / "duplicates.parquet")) == 9


def test_share_rule_edges():
    check_share(10, {"exact": 5, "near": 0, "eval": 5}, False)  # exactly half each: allowed
    check_share(0, {"exact": 0, "near": 0, "eval": 0}, False)
    check_share(10, {"exact": 3, "near": 3, "eval": 0}, True)
    with pytest.raises(DedupError, match="6 of 10 samples .60%. would be listed as duplicates"):
        check_share(10, {"exact": 3, "near": 3, "eval": 0}, False)
    with pytest.raises(DedupError, match="evaluation leaks"):
        check_share(10, {"exact": 0, "near": 0, "eval": 6}, False)


def test_out_pointed_at_a_selection_folder_is_refused(tmp_path, capsys):
    data = _corpus(tmp_path)
    sel = tmp_path / "sel"
    sel.mkdir()
    manifest = {"status": "complete", "filter": {"detector": "oracle"}, "kept": 3}
    (sel / "manifest.json").write_text(json.dumps(manifest))
    assert _dedup(data, sel) == 2
    err = _err(capsys)
    assert "out: " in err and str(sel) in err and "another stage" in err
    assert json.loads((sel / "manifest.json").read_text()) == manifest
    assert not (sel / "duplicates.parquet").exists() and not (sel / "_parts").exists()


@pytest.mark.parametrize("name", ["000000.tar", "kept.parquet", "sizes.json"])
def test_out_holding_shards_or_a_selection_is_refused(tmp_path, capsys, name):
    data = _corpus(tmp_path)
    out = tmp_path / "o"
    out.mkdir()
    (out / name).write_bytes(b"x")
    assert _dedup(data, out) == 2
    assert name in _err(capsys)


def test_out_of_dedup_itself_is_reused(tmp_path):
    data = _corpus(tmp_path)
    assert _dedup(data, tmp_path / "d") == 0
    first = (tmp_path / "d" / "duplicates.parquet").read_bytes()
    parts = file_ids(tmp_path / "d" / "_parts")
    assert len(parts) == len(list(data.glob("*.tar"))) > 1
    assert _dedup(data, tmp_path / "d") == 0  # its own folder: not refused, rerun (resume) as before
    assert (tmp_path / "d" / "duplicates.parquet").read_bytes() == first
    # every per-shard part is reused as it is: counted, and the same files (and records), never rewritten
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["shards_reused"] == len(parts)
    assert file_ids(tmp_path / "d" / "_parts") == parts


def test_unweighted_model_is_refused_unless_random_is_named(tmp_path, capsys):
    """A CLIP arch without weights would see every image alike: refused unless pretrained=random is named."""
    data = _corpus(tmp_path)
    assert _dedup(data, tmp_path / "d", "--model", "clip:arch=halsift-tiny") == 2
    err = _err(capsys)
    assert "pretrained" in err


def test_a_random_weight_model_that_sees_every_image_alike_is_stopped(tmp_path, capsys):
    """The issue's case: a random-init CLIP lists every corpus image as a leak of unrelated evaluation images;
    the share rule stops it in one line and writes nothing."""
    data = _corpus(tmp_path)
    evals = tmp_path / "evals"
    evals.mkdir()
    for j in range(5):
        (evals / f"e{j}.png").write_bytes(_png(500 + j))
    assert _dedup(data, tmp_path / "d", "--model", "clip:arch=halsift-tiny,pretrained=random", "--against",
                  str(evals)) == 2
    err = _err(capsys)
    assert "evaluation leaks" in err and "implausible" in err
    assert not (tmp_path / "d" / "duplicates.parquet").exists() and not (tmp_path / "d" / "manifest.json").exists()
    # the thumbnails alone (no model) find no leak among these unrelated images
    assert _dedup(data, tmp_path / "t", "--against", str(evals)) == 0
    assert not [r for r in pq.read_table(tmp_path / "t" / "duplicates.parquet").to_pylist() if r["reason"] == "eval"]
