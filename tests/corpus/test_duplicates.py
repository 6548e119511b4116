"""Issue 35: a key repeated in a shard is skipped (its first sample kept), counted and reported the same way by
every reader: the shard reader itself, ``score``, ``stats`` and ``convert webdataset``."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from halsift.corpus.images import SkipCounter
from halsift.corpus.sentences import sentence_texts
from halsift.corpus.shards import iter_shard
from halsift.launch.cli import main

REASON = "repeats in shard"  # the words every reader uses


def _png(colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(buf, "PNG")
    return buf.getvalue()


def _sample(key: str, caption: str, colour=(200, 10, 10)) -> list[tuple[str, bytes]]:
    meta = {"key": key, "captioner": "capA", "source": "i2t",
            "sentences": [{"text": t, "label": "correct", "position": i}
                          for i, t in enumerate(sentence_texts(caption))]}
    return [(f"{key}.png", _png(colour)), (f"{key}.txt", caption.encode()), (f"{key}.json", json.dumps(meta).encode())]


def raw_shard(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A tar with exactly these members (halsift's own writer refuses a repeated key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _read(path: Path) -> tuple[list[tuple[str, str]], dict]:
    skipped = SkipCounter()
    got = [(s.key, s.caption) for s in iter_shard(path, skipped)]
    return got, skipped.to_json()


def test_back_to_back_duplicate_is_skipped_not_merged(tmp_path):
    """Before: the two 'a' samples were merged into one (the second's members overwrote the first's), uncounted."""
    path = raw_shard(tmp_path / "000000.tar", _sample("a", "A red dog.") + _sample("a", "A blue cat.", (0, 0, 200))
                     + _sample("b", "A green tree."))
    got, skipped = _read(path)
    assert got == [("a", "A red dog."), ("b", "A green tree.")]
    assert skipped["by_kind"] == {"duplicate": 1}
    assert skipped["samples"][0]["key"] == "a" and REASON in skipped["samples"][0]["reason"]


def test_duplicate_later_in_the_shard_is_skipped(tmp_path):
    """Variant: the repeat is not adjacent (a, b, a); before it was yielded twice."""
    path = raw_shard(tmp_path / "000000.tar", _sample("a", "One.") + _sample("b", "Two.") + _sample("a", "Three."))
    got, skipped = _read(path)
    assert got == [("a", "One."), ("b", "Two.")] and skipped["by_kind"] == {"duplicate": 1}


def test_a_stray_repeated_member_is_a_duplicate(tmp_path):
    """Variant: only one member repeats (a second a.txt right after the first sample)."""
    path = raw_shard(tmp_path / "000000.tar", _sample("a", "One.") + [("a.txt", b"Other.")] + _sample("b", "Two."))
    got, skipped = _read(path)
    assert got == [("a", "One."), ("b", "Two.")] and skipped["by_kind"] == {"duplicate": 1}


def test_score_skips_counts_and_reports_duplicates(tmp_path, capsys):
    data = tmp_path / "shards"
    raw_shard(data / "000000.tar", _sample("a", "A red dog. It runs.") + _sample("a", "A blue cat.")
              + _sample("b", "A green tree."))
    out = tmp_path / "scores"
    assert main(["score", "--detector", "random:seed=0", "--data", str(data), "--out", str(out), "--no-progress"]) == 0
    m = json.loads((out / "_manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"duplicate": 1} and m["samples"] == 2
    assert m["sentences"] == 3  # a's first caption (two sentences) and b's; not the duplicate's
    assert REASON in m["skipped"]["samples"][0]["reason"]
    assert "skipped 1" in capsys.readouterr().out


def test_stats_counts_duplicates(tmp_path):
    from halsift.corpus.stats import stats

    data = tmp_path / "shards"
    raw_shard(data / "000000.tar", _sample("a", "One.") + _sample("b", "Two.") + _sample("a", "Three."))
    st = stats(data)
    assert st["skipped"] == {"duplicate": 1}
    assert st["generators"]["all"]["sentences"] == 2


def test_convert_webdataset_skips_duplicates_with_the_same_words(tmp_path, capsys):
    """Before: webdataset's grouping raised on the back-to-back repeat, and convert failed (exit 2)."""
    src = raw_shard(tmp_path / "src" / "000000.tar", _sample("a", "One.") + _sample("a", "Two.")
                    + _sample("b", "Three."))
    assert main(["convert", "webdataset", str(src), "--out", str(tmp_path / "sh")]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["samples"] == 2 and summary["skipped"] == {"duplicate": 1}
    assert REASON in summary["skipped_examples"][0]
    got, skipped = _read(tmp_path / "sh" / "000000.tar")
    assert got == [("a", "One."), ("b", "Three.")] and skipped["total"] == 0


def test_convert_webdataset_non_adjacent_duplicate_is_skipped_not_renamed(tmp_path, capsys):
    """Variant: before, the second 'a' became a new sample 'a_1'."""
    src = raw_shard(tmp_path / "src" / "000000.tar", _sample("a", "One.") + _sample("b", "Two.")
                    + _sample("a", "Three."))
    assert main(["convert", "webdataset", str(src), "--out", str(tmp_path / "sh")]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["skipped"] == {"duplicate": 1} and summary["renamed_keys"] == 0
    assert [k for k, _ in _read(tmp_path / "sh" / "000000.tar")[0]] == ["a", "b"]


def test_convert_table_counts_the_keys_it_renames(tmp_path, capsys):
    """Variant: a table's repeated key column is kept (rows are not shard samples) but renamed and counted."""
    (tmp_path / "i.png").write_bytes(_png((1, 2, 3)))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"image": "i.png", "caption": c, "id": "x"}) + "\n"
                                              for c in ("One.", "Two.")))
    assert main(["convert", "table", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "sh"), "--key-col",
                 "id"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["samples"] == 2 and summary["renamed_keys"] == 1 and summary["renamed_examples"] == ["x -> x_1"]


def test_a_key_in_two_shards_is_refused_by_score_and_by_select_naming_both(tmp_path, capsys, monkeypatch):
    """The boundary of the rule (documented): keys are compared within a shard as it is read, and across shards
    once every part is written: score refuses the folder naming both shards; select refuses a folder holding the key
    twice anyway (written before score checked) in one line naming the two parts."""
    data = tmp_path / "shards"
    raw_shard(data / "000000.tar", _sample("a", "One."))
    raw_shard(data / "000001.tar", _sample("a", "Two."))
    score = ["score", "--detector", "random:seed=0", "--data", str(data), "--no-progress"]
    assert main([*score, "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the key 'a' names samples in two inputs" in err and "000000.tar" in err and "000001.tar" in err
    import halsift.filtering.scoring.parts as parts

    monkeypatch.setattr(parts, "repeated_key", lambda files: None)  # a score folder from before the check
    out = tmp_path / "scores"
    assert main([*score, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["select", "--scores", str(out), "--data", str(data), "--out", str(tmp_path / "sel"), "--keep",
                 "0.5", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "appears more than once" in err
    assert "part-000000.parquet" in err and "part-000001.parquet" in err


@pytest.mark.parametrize("ext", ["png", "txt"])
def test_a_sample_after_a_duplicate_is_read_whole(tmp_path, ext):
    """Variant: the duplicate's members are not read, and the sample after it is intact."""
    members = _sample("a", "One.") + _sample("a", "Two.")
    members += [m for m in _sample("b", "Three.") if m[0].endswith(ext)] + [m for m in _sample("b", "Three.")
                                                                           if not m[0].endswith(ext)]
    samples = list(iter_shard(raw_shard(tmp_path / "000000.tar", members), SkipCounter()))
    assert [s.key for s in samples] == ["a", "b"]
    assert samples[1].caption == "Three." and samples[1].image and samples[1].meta["captioner"] == "capA"
