"""Issue 35 (risk): a caption that is not valid UTF-8 is skipped and counted (``bad_caption``), never replaced with
U+FFFD and scored or converted as if someone had written it."""

from __future__ import annotations

import json

from test_duplicates import _png, _sample, raw_shard

from halsift.corpus.images import SkipCounter
from halsift.corpus.shards import iter_shard
from halsift.launch.cli import main

BAD = b"A red dog \xff\xfe on the grass."


def _bad(key: str) -> list[tuple[str, bytes]]:
    return [(n, BAD if n.endswith(".txt") else d) for n, d in _sample(key, "placeholder.")]


def test_shard_reader_skips_and_counts_a_bad_caption(tmp_path):
    """Before: the sample came back with 'A red dog \ufffd\ufffd on the grass.' and nothing counted."""
    path = raw_shard(tmp_path / "000000.tar", _bad("a") + _sample("b", "Fine."))
    skipped = SkipCounter()
    assert [s.key for s in iter_shard(path, skipped)] == ["b"]
    j = skipped.to_json()
    assert j["by_kind"] == {"bad_caption": 1}
    assert j["samples"][0]["key"] == "a" and "not valid UTF-8 (byte 10" in j["samples"][0]["reason"]


def test_score_counts_bad_captions(tmp_path):
    data = tmp_path / "shards"
    raw_shard(data / "000000.tar", _bad("a") + _sample("b", "Fine. Also fine."))
    out = tmp_path / "scores"
    assert main(["score", "--detector", "random:seed=0", "--data", str(data), "--out", str(out), "--no-progress"]) == 0
    m = json.loads((out / "_manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"bad_caption": 1} and m["samples"] == 1 and m["sentences"] == 2


def test_multibyte_utf8_is_kept_exactly(tmp_path):
    """The rule refuses bad bytes only: accents, CJK and emoji are captions like any other."""
    text = "Un café à Kyōto: 京都の猫 🐈."
    path = raw_shard(tmp_path / "000000.tar", _sample("a", text))
    skipped = SkipCounter()
    assert [s.caption for s in iter_shard(path, skipped)] == [text] and skipped.total == 0


def test_convert_folder_skips_a_bad_caption_file(tmp_path, capsys):
    """Variant: the sidecar .txt of an image folder (before: read with errors='replace')."""
    src = tmp_path / "imgs"
    src.mkdir()
    for name, caption in (("a", BAD), ("b", b"Fine.")):
        (src / f"{name}.png").write_bytes(_png((9, 9, 9)))
        (src / f"{name}.txt").write_bytes(caption)
    assert main(["convert", "folder", str(src), "--out", str(tmp_path / "sh")]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["samples"] == 1 and summary["skipped"] == {"bad_caption": 1}
    assert "a.txt: caption is not valid UTF-8" in summary["skipped_examples"][0]


def test_convert_webdataset_skips_a_bad_caption(tmp_path, capsys):
    """Variant: WebDataset input (before: decoded with errors='replace')."""
    src = raw_shard(tmp_path / "src" / "000000.tar", _bad("a") + _sample("b", "Fine."))
    assert main(["convert", "webdataset", str(src), "--out", str(tmp_path / "sh")]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["samples"] == 1 and summary["skipped"] == {"bad_caption": 1}
