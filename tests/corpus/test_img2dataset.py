"""img2dataset output as it is (json without captioner/source): score -> select end to end, errors not zeros."""

from __future__ import annotations

import json

from img2dataset_data import make_img2dataset

from halsift.corpus.shards import iter_samples, read_sizes
from halsift.launch.cli import main


def _score(data, out) -> None:
    assert main(["score", "--detector", "random:seed=0", "--data", str(data), "--out", str(out),
                 "--no-progress"]) == 0


def test_img2dataset_score_select(tmp_path, capsys):
    data = make_img2dataset(tmp_path / "i2d")
    _score(data, tmp_path / "sc")
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "kept 8 of 16 units (8 samples written)" in out
    assert "captioner='unknown'" in out and "source='i2t'" in out
    m = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert m["corrupt_shards"] == [] and m["keys"]["only_in_scores"] == 0
    assert m["meta_defaults"]["values"] == {"captioner": "unknown", "source": "i2t"}
    assert m["meta_defaults"]["samples"]["captioner"] == m["source_samples_kept"] > 0
    kept = list(iter_samples(tmp_path / "sel"))
    assert len(kept) == 8 == sum(read_sizes(tmp_path / "sel").values())
    for s in kept:  # img2dataset's own fields survive, the defaults are written
        assert s.meta["captioner"] == "unknown" and s.meta["source"] == "i2t"
        assert s.meta["url"].startswith("https://example.com/") and s.meta["status"] == "success"
        assert s.caption.endswith(".") and s.meta["parent_key"] in s.key


def test_img2dataset_caption_unit_with_flags(tmp_path, capsys):
    data = make_img2dataset(tmp_path / "i2d")
    _score(data, tmp_path / "sc")
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--unit", "caption", "--captioner", "laion-alt", "--source", "t2i",
                 "--no-progress"]) == 0
    kept = list(iter_samples(tmp_path / "sel"))
    assert len(kept) == 4
    assert {(s.meta["captioner"], s.meta["source"]) for s in kept} == {("laion-alt", "t2i")}
    assert all(s.caption == s.meta["caption"] for s in kept)  # whole captions, unchanged


def test_unusable_corpus_is_exit_2_naming_the_field(tmp_path, capsys):
    """A json 'source' no writer accepts makes every sample unwritable: exit 2, not 'kept 0' with exit 0."""
    data = make_img2dataset(tmp_path / "i2d", extra={"source": "web"})
    _score(data, tmp_path / "sc")
    capsys.readouterr()
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no sample could be written" in err and "json field 'source'" in err


def test_scores_of_other_data_is_exit_2(tmp_path, capsys):
    """Scores of one download, shards of another (no key in common): exit 2, not an empty selection."""
    _score(make_img2dataset(tmp_path / "a"), tmp_path / "sc")
    other = make_img2dataset(tmp_path / "b", first_shard=7)
    capsys.readouterr()
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(other), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--no-progress"]) == 2
    assert "no kept key is in the shards (e.g. '000000" in capsys.readouterr().err


def test_export_keys_datacomp_uids_and_key_list(tmp_path, capsys):
    import numpy as np

    data = make_img2dataset(tmp_path / "i2d", uid=True)
    _score(data, tmp_path / "sc")
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--unit", "caption", "--export-keys", str(tmp_path / "subset.npy"),
                 "--no-progress"]) == 0
    assert "wrote 4 uids" in capsys.readouterr().out
    arr = np.load(tmp_path / "subset.npy")
    kept = list(iter_samples(tmp_path / "sel"))
    want = sorted((int(s.meta["uid"][:16], 16), int(s.meta["uid"][16:], 16)) for s in kept)
    assert arr.dtype == np.dtype("u8,u8") and arr.tolist() == want and len(want) == 4
    # sentence units: one entry per source sample, by source key
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(data), "--out", str(tmp_path / "sel2"),
                 "--keep", "0.5", "--export-keys", str(tmp_path / "keys.txt"), "--no-progress"]) == 0
    keys = (tmp_path / "keys.txt").read_text().split()
    assert keys == sorted({s.meta["parent_key"] for s in iter_samples(tmp_path / "sel2")})
    # no uid in the data: a DataComp file cannot be written -> exit 2 naming the field
    plain = make_img2dataset(tmp_path / "plain")
    _score(plain, tmp_path / "sc3")
    capsys.readouterr()
    assert main(["select", "--scores", str(tmp_path / "sc3"), "--data", str(plain), "--out", str(tmp_path / "sel3"),
                 "--keep", "0.5", "--export-keys", str(tmp_path / "x.npy"), "--no-progress"]) == 2
    assert "json field 'uid' is missing" in capsys.readouterr().err and not (tmp_path / "x.npy").exists()


def test_resumable_select_writes_img2dataset_samples_and_skips_bad_ones_one_by_one(tmp_path, capsys):
    """``select --resumable`` (the out-of-core, per-shard path) fills the same json defaults as the in-memory
    select, and a sample the writer rejects is skipped and counted, not the rest of its shard."""
    data = make_img2dataset(tmp_path / "i2d")
    _score(data, tmp_path / "sc")
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(data), "--out", str(tmp_path / "mem"),
                 "--keep", "0.5", "--no-progress", "--captioner", "laion-alt"]) == 0
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(data), "--out", str(tmp_path / "res"),
                 "--keep", "0.5", "--no-progress", "--captioner", "laion-alt", "--resumable"]) == 0
    mem, res = list(iter_samples(tmp_path / "mem")), list(iter_samples(tmp_path / "res"))
    assert sorted(s.key for s in res) == sorted(s.key for s in mem) and len(res) == 8
    assert {s.meta["captioner"] for s in res} == {"laion-alt"}
    bad = make_img2dataset(tmp_path / "bad", extra={"source": "web"})  # no writer accepts source 'web'
    _score(bad, tmp_path / "sc2")
    main(["select", "--scores", str(tmp_path / "sc2"), "--data", str(bad), "--out", str(tmp_path / "res2"),
          "--keep", "0.5", "--no-progress", "--resumable"])
    m = json.loads((tmp_path / "res2" / "manifest.json").read_text())
    assert m["source_samples_kept"] == 0 and m["skipped_samples"]["count"] > 0  # every kept sample, one by one
    assert m["corrupt_shards"] == [] and "source" in m["skipped_samples"]["examples"][0]
