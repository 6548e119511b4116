"""One limit per concept across the stages that read shards (issue 41): the same image-size limit (score with a
text-only detector skips what dedup skips), the same empty-input rule (0-byte and empty tars: exit 2 in score,
dedup, basic and embed), the same duplicate-key rule (a key repeated within a shard or a table: the first kept, the
rest counted; a key in two shards or tables: refused in one line naming both); basic reads huge images' headers;
basic's table sizes must be numbers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from filtering_data import free_port
from PIL import Image

from halsift.corpus.images import DEFAULT_MAX_PIXELS, ImageDecodeError, check_size, header_size
from halsift.corpus.sample import repeated_key
from halsift.corpus.shards import Sample, ShardWriter
from halsift.launch.cli import main

M = {"captioner": "t", "source": "i2t"}
FAST = ["--languages", "en", "de", "--no-progress"]
TINY = "clip:arch=halsift-tiny,pretrained=random,seed=0"


def _jpeg(w: int, h: int) -> bytes:
    """A small real JPEG whose SOF header is rewritten to say w x h (no pixels for that size are ever made)."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    i = 2
    while data[i + 1] not in (0xC0, 0xC1, 0xC2):
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    data[i + 5:i + 7], data[i + 7:i + 9] = h.to_bytes(2, "big"), w.to_bytes(2, "big")
    return bytes(data)


def _png(w: int = 32, h: int = 32, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (seed * 7 % 256, seed * 13 % 256, 90)).save(buf, "PNG")
    return buf.getvalue()


def _png_header(w: int, h: int) -> bytes:
    data = bytearray(_png())
    data[16:20], data[20:24] = w.to_bytes(4, "big"), h.to_bytes(4, "big")
    return bytes(data)


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# ---------------------------------------------------------------- image size
@pytest.mark.parametrize("w,h", [(20000, 20000), (9000, 9000), (65000, 3), (300, 200)])
def test_header_size_reads_any_size_without_decoding(w, h):
    assert header_size(_jpeg(w, h)) == (w, h)
    assert header_size(_png_header(w, h)) == (w, h)


def test_header_size_of_unreadable_data_is_none():
    for data in (b"", b"not an image", b"\xff\xd8\xff" + b"\x00" * 10, b"\x89PNG\r\n\x1a\n"):
        assert header_size(data) is None


def test_check_size_is_the_decoders_limit():
    side = int(DEFAULT_MAX_PIXELS ** 0.5)
    check_size(_jpeg(side, side))  # exactly the limit: allowed
    for w, h in ((side + 1, side), (9000, 9000), (12000, 12000), (20000, 20000)):
        with pytest.raises(ImageDecodeError, match="decompression bomb refused") as e:
            check_size(_jpeg(w, h), "k")
        assert e.value.kind == "bomb"
    check_size(b"garbage")  # an unreadable header is the decoder's to judge


def _bomb_corpus(tmp_path):
    """10 ordinary samples and 3 whose headers say more pixels than the limit (just above; above Pillow's own
    limit; 20000x20000)."""
    with ShardWriter(tmp_path / "c", maxcount=20) as w:
        for i in range(10):
            w.write(Sample(f"ok{i}", _png(seed=i), f"A photo number {i}.", dict(M), ext="png"))
        for k, (bw, bh) in enumerate([(8193, 8192), (12000, 12000), (20000, 20000)]):
            w.write(Sample(f"big{k}", _jpeg(bw, bh), "A huge photo.", dict(M), ext="jpg"))
    return tmp_path / "c"


def test_every_stage_skips_the_same_oversized_images(tmp_path):
    data = _bomb_corpus(tmp_path)
    assert main(["score", "--detector", "random:seed=1", "--data", str(data), "--out", str(tmp_path / "s"),
                 "--no-progress"]) == 0
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    score_m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    dedup_m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    scored = {
        k for p in sorted((tmp_path / "s").glob("part-*.parquet")) for k in pq.read_table(p).column("key").to_pylist()}
    assert scored == {f"ok{i}" for i in range(10)}
    assert dedup_m["samples"] == 10 and dedup_m["skipped"]["by_kind"] == {"bomb": 3}
    assert json.dumps(score_m).count('"bomb"') >= 1


def test_basic_records_the_size_of_huge_headers(tmp_path):
    data = _bomb_corpus(tmp_path)
    assert main(["basic", "--data", str(data), "--out", str(tmp_path / "b"), "--size-from", "header", *FAST]) == 0
    rows = {r["key"]: r for p in sorted((tmp_path / "b").glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()}
    assert (rows["big2"]["width"], rows["big2"]["height"]) == (20000, 20000)
    assert (rows["big1"]["width"], rows["big1"]["height"]) == (12000, 12000)
    assert all(rows[f"ok{i}"]["width"] == 32 for i in range(10))


# ---------------------------------------------------------------- empty inputs
def _empty_inputs(tmp_path, how: str):
    d = tmp_path / how
    d.mkdir()
    if how == "zero_byte":
        (d / "000000.tar").write_bytes(b"")
    elif how == "empty_tar":
        tarfile.open(d / "000000.tar", "w").close()
    elif how == "two_empty":
        (d / "000000.tar").write_bytes(b"")
        tarfile.open(d / "000001.tar", "w").close()
    else:  # only samples every stage skips (no image member; by hand: ShardWriter refuses them)
        with tarfile.open(d / "000000.tar", "w") as tf:
            for name, data in (("x.txt", b"A caption."), ("x.json", json.dumps(M).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return d


@pytest.mark.parametrize("how", ["zero_byte", "empty_tar", "two_empty"])
@pytest.mark.parametrize("stage", ["score", "dedup", "basic", "embed"])
def test_empty_inputs_are_refused_by_every_stage(tmp_path, capsys, how, stage):
    data = _empty_inputs(tmp_path, how)
    args = {"score": ["score", "--detector", "random:seed=1"], "dedup": ["dedup"], "basic": ["basic", *FAST],
            "embed": ["embed", "--model", TINY]}[stage]
    assert main([*args, "--data", str(data), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = _err(capsys)
    assert "nothing to" in err and ("skipped" in err)
    if stage == "dedup":
        assert not (tmp_path / "o" / "duplicates.parquet").exists()
    if stage in ("basic", "embed"):  # a failed run's manifest says so, and why
        m = json.loads((tmp_path / "o" / ("manifest.json" if stage == "basic" else "_manifest.json")).read_text())
        assert m["status"] == "failed" and "nothing to" in json.dumps(m)


def test_one_good_shard_beside_an_empty_one_is_read(tmp_path):
    d = tmp_path / "c"
    with ShardWriter(d, maxcount=10) as w:
        for i in range(4):
            w.write(Sample(f"k{i}", _png(seed=i), f"A photo number {i}.", dict(M), ext="png"))
    (d / "000009.tar").write_bytes(b"")
    assert main(["dedup", "--data", str(d), "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["samples"] == 4 and m["skipped"]["by_kind"] == {"corrupt_shard": 1}


# ---------------------------------------------------------------- basic tables
def test_basic_table_size_columns_must_hold_numbers(tmp_path, capsys):
    for cols, bad in (({"width": ["640"], "height": [480]}, "width"),
                      ({"original_width": [640], "original_height": ["480px"]}, "original_height")):
        p = tmp_path / f"{bad}.parquet"
        pq.write_table(pa.table({"key": ["a"], "caption": ["A red car parked on the street."], **cols}), p)
        assert main(["basic", "--data", str(p), "--out", str(tmp_path / f"o_{bad}"), *FAST]) == 2
        err = _err(capsys)
        assert p.name in err and repr(bad) in err and "expected numbers" in err


def test_basic_table_with_repeated_keys_keeps_the_first(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"key": ["a", "b", "a", "c", "b"],
                             "caption": ["First a.", "First b.", "Second a.", "Only c.", "Second b."],
                             "width": [100, 200, 300, 400, 500], "height": [100, 200, 300, 400, 500]}), p)
    assert main(["basic", "--data", str(p), "--out", str(tmp_path / "b"), *FAST]) == 0
    rows = pq.read_table(tmp_path / "b" / "part-t.parquet").to_pylist()
    assert [(r["key"], r["width"]) for r in rows] == [("a", 100), ("b", 200), ("c", 400)]
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"duplicate": 2}


def test_basic_table_with_odd_numbers_leaves_sizes_null(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"key": ["a", "b", "c", "d"], "caption": ["A cat."] * 4,
                             "width": [float("nan"), float("inf"), -3.0, 64.0],
                             "height": [10.0, 10.0, 10.0, 48.0]}), p)
    assert main(["basic", "--data", str(p), "--out", str(tmp_path / "b"), *FAST]) == 0
    rows = {r["key"]: r for r in pq.read_table(tmp_path / "b" / "part-t.parquet").to_pylist()}
    assert [rows[k]["width"] for k in "abcd"] == [None, None, None, 64]


def test_a_key_repeated_within_a_shard_is_kept_once_by_every_stage(tmp_path):
    (tmp_path / "c").mkdir()
    with tarfile.open(tmp_path / "c" / "000000.tar", "w") as tf:  # by hand: ShardWriter refuses a repeated key
        for i, k in enumerate(["a", "b", "a", "c"]):
            for ext, data in (("png", _png(seed=i)), ("txt", f"A photo number {i}.".encode()),
                              ("json", json.dumps(M).encode())):
                info = tarfile.TarInfo(f"{k}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    assert main(["dedup", "--data", str(tmp_path / "c"), "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    assert main(["basic", "--data", str(tmp_path / "c"), "--out", str(tmp_path / "b"), *FAST]) == 0
    assert main(["score", "--detector", "random:seed=1", "--data", str(tmp_path / "c"), "--out",
                 str(tmp_path / "s"), "--no-progress"]) == 0
    d = json.loads((tmp_path / "d" / "manifest.json").read_text())
    b = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert d["samples"] == b["samples"] == 3
    assert d["skipped"]["by_kind"] == b["skipped"]["by_kind"] == {"duplicate": 1}
    scored = [k for p in sorted((tmp_path / "s").glob("part-*.parquet")) for k in pq.read_table(p).column("key").to_pylist()]
    assert sorted(set(scored)) == ["a", "b", "c"]


def test_a_key_in_two_shards_is_refused_where_the_shards_meet(tmp_path, capsys):
    """dedup sees every shard at once: it refuses a key naming samples of two shards, as score does once its parts
    are written (both name the key and the two shards; the parts stay) and select then refuses the failed folder."""
    with ShardWriter(tmp_path / "c", maxcount=3) as w:
        for i, k in enumerate(["a", "b", "c"]):
            w.write(Sample(k, _png(seed=i), f"A photo number {i}.", dict(M), ext="png"))
    with ShardWriter(tmp_path / "c2", maxcount=3) as w:
        for i, k in enumerate(["d", "b", "e"]):
            w.write(Sample(k, _png(seed=10 + i), f"Another photo {i}.", dict(M), ext="png"))
    (tmp_path / "c2" / "000000.tar").rename(tmp_path / "c" / "000001.tar")
    assert main(["dedup", "--data", str(tmp_path / "c"), "--out", str(tmp_path / "d"), "--no-progress"]) == 2
    err = _err(capsys)
    assert "'b'" in err and "000000.tar" in err and "000001.tar" in err
    assert not (tmp_path / "d" / "duplicates.parquet").exists()
    assert main(["score", "--detector", "random:seed=1", "--data", str(tmp_path / "c"), "--out", str(tmp_path / "s"),
                 "--no-progress"]) == 2
    err = _err(capsys)
    assert "the key 'b' names samples in two inputs" in err and "000000.tar" in err and "000001.tar" in err
    assert sorted(p.name for p in (tmp_path / "s").glob("part-*.parquet")) != []  # the parts stay
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(tmp_path / "c"), "--out",
                 str(tmp_path / "sel"), "--keep", "1", "--no-progress"]) == 2
    assert "the key 'b' names samples in two inputs" in _err(capsys)  # the failed folder's reason


def test_only_skipped_samples_are_refused_by_embed(tmp_path, capsys):
    """Every sample skipped (no image member) is nothing read, as for the other stages; the parts stay."""
    data = _empty_inputs(tmp_path, "all_skipped")
    assert main(["embed", "--model", TINY, "--data", str(data), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = _err(capsys)
    assert "nothing to embed" in err and "missing_image=1" in err
    assert json.loads((tmp_path / "o" / "_manifest.json").read_text())["status"] == "failed"


def _two_shards(tmp_path, first: list[str], second: list[str]):
    """Shards 000000.tar and 000001.tar in one folder holding ``first`` and ``second``'s keys (by hand: ShardWriter
    refuses a key repeated within a shard)."""
    c = tmp_path / "c"
    c.mkdir()
    for n, keys in enumerate((first, second)):
        with tarfile.open(c / f"00000{n}.tar", "w") as tf:
            for i, k in enumerate(keys):
                for ext, data in (("png", _png(seed=10 * n + i)), ("txt", f"A photo of thing {n}{i}.".encode()),
                                  ("json", json.dumps(M).encode())):
                    info = tarfile.TarInfo(f"{k}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return c


@pytest.mark.parametrize("stage", ["basic", "embed", "dedup", "score"])
@pytest.mark.parametrize("keys", [(["a", "b", "c"], ["d", "b", "e"]), (["a", "z"], ["x", "y", "z"]),
                                  (["a", "b", "b"], ["c", "a"])])
def test_a_key_in_two_shards_is_refused_by_every_stage_that_sees_them(tmp_path, capsys, stage, keys):
    """The one duplicate-key rule: the same line names the key and both shards, wherever the key sits in them (a
    repeat within the first shard is still only a skipped duplicate)."""
    c = _two_shards(tmp_path, *keys)
    args = {"basic": ["basic", *FAST], "embed": ["embed", "--model", TINY], "dedup": ["dedup"],
            "score": ["score", "--detector", "random:seed=1"]}[stage]
    assert main([*args, "--data", str(c), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = _err(capsys)
    twice = (set(keys[0]) & set(keys[1])).pop()
    assert f"the key {twice!r} names samples in two inputs" in err
    assert "000000.tar" in err and "000001.tar" in err
    if stage != "dedup":
        m = json.loads((tmp_path / "o" / ("manifest.json" if stage == "basic" else "_manifest.json")).read_text())
        assert m["status"] == "failed" and repr(twice) in m["error"]


@pytest.mark.parametrize("stage", ["basic", "embed"])
def test_distinct_keys_in_two_shards_pass(tmp_path, stage):
    c = _two_shards(tmp_path, ["a", "b", "b"], ["c", "d"])
    args = {"basic": ["basic", *FAST], "embed": ["embed", "--model", TINY]}[stage]
    assert main([*args, "--data", str(c), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    m = json.loads((tmp_path / "o" / ("_manifest.json" if stage == "embed" else "manifest.json")).read_text())
    assert m["status"] == "complete" and m["samples"] == 4 and m["skipped"]["by_kind"] == {"duplicate": 1}


def test_basic_tables_sharing_a_key_are_refused(tmp_path, capsys):
    """Tables (here with an integer ``uid`` key column) follow the same rule: a uid in two tables is refused
    naming both; repeated within one table it is a skipped duplicate."""
    d = tmp_path / "t"
    d.mkdir()
    cap = "A red car parked on the street."
    pq.write_table(pa.table({"uid": [1, 2, 2], "caption": [cap] * 3, "width": [640] * 3, "height": [480] * 3}),
                   d / "a.parquet")
    pq.write_table(pa.table({"uid": [3, 4], "caption": [cap] * 2, "width": [640] * 2, "height": [480] * 2}),
                   d / "b.parquet")
    assert main(["basic", "--data", str(d), "--out", str(tmp_path / "ok"), *FAST]) == 0
    pq.write_table(pa.table({"uid": [5, 1], "caption": [cap] * 2, "width": [640] * 2, "height": [480] * 2}),
                   d / "c.parquet")
    assert main(["basic", "--data", str(d), "--out", str(tmp_path / "o"), *FAST]) == 2
    err = _err(capsys)
    assert "the key '1' names samples in two inputs" in err and "a.parquet" in err and "c.parquet" in err


def test_repeated_key_counts_inputs_not_rows(tmp_path):
    """Many rows of one key within one part (an embedding part's image, caption and sentence rows) are one
    sample; the first pair of parts sharing a key is reported, by index in the list given."""
    files = []
    for name, keys in (("p0", ["a", "a", "a", "b"]), ("p1", ["c", "c"]), ("p2", ["d", "b", "b"])):
        files.append(tmp_path / f"{name}.parquet")
        pq.write_table(pa.table({"key": keys, "x": list(range(len(keys)))}), files[-1])
    assert repeated_key(files[:2]) is None and repeated_key(files[1:]) is None and repeated_key(files[:1]) is None
    assert repeated_key(files) == ("b", 0, 2)
    assert repeated_key(files[::-1]) == ("b", 0, 2)


def test_a_key_in_two_shards_stops_every_rank_of_a_launch(tmp_path):
    """Under two ranks every rank stops with the rule's one line (none is left waiting for rank 0's manifest)."""
    c = _two_shards(tmp_path, ["a", "b"], ["c", "b"])
    env = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "halsift.launch.cli", "embed", "--model", TINY, "--data", str(c), "--out", str(tmp_path / "o"),
           "--device", "cpu", "--no-progress"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert proc.stderr.count("the key 'b' names samples in two inputs") == 2, proc.stderr[-3000:]
    assert json.loads((tmp_path / "o" / "_manifest.json").read_text())["status"] == "failed"
