"""Issue 35: img2dataset's ``_stats.json`` ``count`` counts download attempts; ``successes`` is what the tar holds.
A folder with failed downloads is read as whole (score, select, stats), and a tar short of its successes is still
reported as damaged."""

from __future__ import annotations

import json

from img2dataset_data import make_img2dataset

from halsift.launch.cli import main

SENTENCES = {"sentences": [{"text": "A red dog number on the grass.", "label": "correct", "position": 0},
                           {"text": "A blue car behind it.", "label": "incorrect", "position": 1}]}


def _failed_downloads(folder, failed: int = 3, successes: int = 4) -> None:
    """Rewrite each ``_stats.json`` as img2dataset writes it for a shard where ``failed`` downloads failed."""
    for p in folder.glob("*_stats.json"):
        p.write_text(json.dumps({"count": successes + failed, "successes": successes, "failed_to_download": failed,
                                 "failed_to_resize": 0}))


def _score(data, out) -> dict:
    assert main(["score", "--detector", "random:seed=0", "--data", str(data), "--out", str(out),
                 "--no-progress"]) == 0
    return json.loads((out / "_manifest.json").read_text())


def test_score_and_select_read_shards_with_failed_downloads_as_whole(tmp_path, capsys):
    """Before: every shard was a corrupt_shard with 3 samples 'lost', in the score and the select manifests."""
    data = make_img2dataset(tmp_path / "i2d", shards=2, per_shard=4)
    _failed_downloads(data)
    m = _score(data, tmp_path / "sc")
    assert m["skipped"]["total"] == 0 and m["samples"] == 8
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--no-progress"]) == 0
    sel = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert sel["corrupt_shards"] == [] and sel["skipped"]["total"] == 0


def test_stats_reads_shards_with_failed_downloads(tmp_path, capsys):
    """Before: `halsift stats` exited 2 ('holds 4 samples but ... records 7')."""
    data = make_img2dataset(tmp_path / "i2d", shards=2, per_shard=4, extra=SENTENCES)
    _failed_downloads(data)
    assert main(["stats", str(data), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["generators"]["all"]["sentences"] == 16 and st["skipped"] == {}


def test_a_tar_short_of_its_successes_is_still_damaged(tmp_path):
    """Variant: the rule reads the right field, it does not stop checking: 5 successes recorded, 4 in the tar."""
    data = make_img2dataset(tmp_path / "i2d", shards=1, per_shard=4)
    _failed_downloads(data, failed=1, successes=5)
    m = _score(data, tmp_path / "sc")
    assert m["skipped"]["by_kind"] == {"corrupt_shard": 1}
    reason = m["skipped"]["samples"][0]["reason"]
    assert "holds 4 samples but 00000_stats.json (successes) records 5" in reason


def test_our_own_stats_count_still_checks(tmp_path):
    """Variant: a halsift shard's ``_stats.json`` (``count``, no ``successes``) is what is read without sizes.json."""
    from filtering_data import make_corpus

    data = make_corpus(tmp_path / "c", shards=1, per_shard=3)
    (data / "sizes.json").unlink()
    stats = json.loads((data / "000000_stats.json").read_text())
    (data / "000000_stats.json").write_text(json.dumps({**stats, "count": 5}))
    m = _score(data, tmp_path / "sc")
    assert m["skipped"]["by_kind"] == {"corrupt_shard": 2}
    assert "000000_stats.json (count) records 5" in m["skipped"]["samples"][0]["reason"]
