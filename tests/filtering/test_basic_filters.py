"""`halsift basic`: language, word/character counts and image sizes with exact counts on inputs of known languages
and sizes (halsift shards, img2dataset shards, parquet tables), resumable per part; DataComp's preset."""

from __future__ import annotations

import io
import json
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from img2dataset_data import make_img2dataset

from halsift.corpus.shards import Sample, ShardWriter
from halsift.filtering.curation.basic import PRESETS, apply_presets, fields_table, header_size
from halsift.launch.cli import main

# (key, caption, (width, height)): language and size chosen so that each DataComp rule fails where stated
SAMPLES = [
    ("en_ok", "A red dog runs on the green grass near the river.", (640, 480)),          # passes
    ("en_short", "Happy dog", (640, 480)),                                               # words (2 words)
    ("de", "Ein roter Hund läuft auf dem grünen Gras am Fluss.", (640, 480)),            # english
    ("fr", "Un chien rouge court sur l'herbe verte près de la rivière.", (300, 300)),   # english
    ("es", "Un perro rojo corre sobre la hierba verde junto al río.", (640, 480)),      # english
    ("en_small", "A tall lighthouse stands on the rocky coast at dusk.", (150, 400)),     # short_side
    ("en_wide", "A very wide panoramic view of the mountain range.", (1000, 250)),        # aspect 4
    ("en_edge", "Two cats are sleeping together on a soft blue sofa.", (200, 600)),       # passes (200, 3.0)
]
LANG = {"en_ok": "en", "en_short": "en", "de": "de", "fr": "fr", "es": "es", "en_small": "en", "en_wide": "en",
        "en_edge": "en"}
FAST = ["--languages", "en", "de", "fr", "es", "--no-progress"]


def _png(size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buf, "PNG")
    return buf.getvalue()


def _shards(out, samples=SAMPLES, per_shard=4):
    with ShardWriter(out, maxcount=per_shard) as w:
        for key, cap, size in samples:
            w.write(Sample(key, _png(size), cap, {"captioner": "t", "source": "i2t"}, "png"))
    return out


def _fields(out) -> dict[str, dict]:
    t = pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("part-*.parquet")))
    return {r["key"]: r for r in t.to_pylist()}


def test_header_size_reads_no_pixels():
    assert header_size(_png((123, 45))) == (123, 45)
    rng = random.Random(0)
    noise = Image.frombytes("RGB", (300, 200), bytes(rng.randrange(256) for _ in range(300 * 200 * 3)))
    buf = io.BytesIO()
    noise.save(buf, "JPEG")
    head = buf.getvalue()[:2000]  # the header and the start of the scan: the pixels cannot be decoded
    with pytest.raises(OSError, match="truncated|broken|image file"):
        Image.open(io.BytesIO(head)).load()
    assert header_size(head) == (300, 200)
    assert header_size(b"not an image") is None and header_size(b"") is None


def test_datacomp_preset_exact_counts_on_shards(tmp_path, capsys):
    data = _shards(tmp_path / "shards")
    assert main(["basic", "--data", str(data), "--out", str(tmp_path / "b"), *FAST]) == 0
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    c = m["presets"]["datacomp"]
    assert (c["samples"], c["passed"]) == (8, 2)
    assert c["removed"] == {"english": 3, "words": 1, "chars": 0, "short_side": 1, "aspect": 1}
    assert c["removed_only"] == c["removed"]  # each failing sample fails one rule
    assert m["lang"] == {"en": 5, "de": 1, "fr": 1, "es": 1} and m["size_source"] == {"header": 8}
    rows = _fields(tmp_path / "b")
    assert {k: r["lang"] for k, r in rows.items()} == LANG
    assert {k for k, r in rows.items() if r["pass_datacomp"]} == {"en_ok", "en_edge"}
    assert (rows["en_wide"]["width"], rows["en_wide"]["height"], rows["en_wide"]["short_side"]) == (1000, 250, 250)
    assert rows["en_wide"]["aspect"] == 4.0 and rows["en_edge"]["aspect"] == 3.0
    assert (rows["en_short"]["words"], rows["en_short"]["chars"]) == (2, 9)
    assert 0 < rows["de"]["lang_confidence"] <= 1
    assert "datacomp: 2 of 8 samples pass" in capsys.readouterr().out


def test_resumes_per_part_and_refuses_other_settings(tmp_path, capsys):
    data = _shards(tmp_path / "shards")
    out = tmp_path / "b"
    assert main(["basic", "--data", str(data), "--out", str(out), *FAST]) == 0
    first = (out / "part-000001.parquet").read_bytes()
    (out / "part-000001.parquet").unlink()  # as if killed before the second part
    before = (out / "part-000000.parquet").stat().st_mtime_ns
    assert main(["basic", "--data", str(data), "--out", str(out), *FAST]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["parts_done_before"] == 1 and m["presets"]["datacomp"]["passed"] == 2
    assert (out / "part-000000.parquet").stat().st_mtime_ns == before
    assert (out / "part-000001.parquet").read_bytes() == first
    capsys.readouterr()
    assert main(["basic", "--data", str(data), "--out", str(out), "--languages", "en", "de", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "different language" in err and len(err.strip().splitlines()) == 1


def test_img2dataset_shards_use_recorded_size(tmp_path):
    data = make_img2dataset(tmp_path / "i2d")  # 32x32 jpgs resized from 640x480 originals, English captions
    assert main(["basic", "--data", str(data), "--out", str(tmp_path / "auto"), *FAST]) == 0
    m = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert m["presets"]["datacomp"]["passed"] == 8 and m["size_source"] == {"recorded": 8}
    assert main(["basic", "--data", str(data), "--out", str(tmp_path / "hdr"), "--size-from", "header", *FAST]) == 0
    m = json.loads((tmp_path / "hdr" / "manifest.json").read_text())
    c = m["presets"]["datacomp"]
    assert c["passed"] == 0 and c["removed"]["short_side"] == 8 and c["removed"]["english"] == 0


def test_parquet_tables_without_images(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    rows = [{"key": k, "caption": cap, "width": w, "height": h} for k, cap, (w, h) in SAMPLES]
    rows.append({"key": "nosize", "caption": "A small boat floats on the calm blue lake.", "width": None,
                 "height": None})
    pq.write_table(pa.Table.from_pylist(rows[:5]), tables / "a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[5:]), tables / "b.parquet")
    assert main(["basic", "--data", str(tables), "--out", str(tmp_path / "b"), *FAST]) == 0
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    c = m["presets"]["datacomp"]
    assert (c["samples"], c["passed"]) == (9, 2) and m["parts"] == ["part-a.parquet", "part-b.parquet"]
    assert c["removed"]["short_side"] == 2 and c["removed"]["aspect"] == 2  # the null size fails both
    assert _fields(tmp_path / "b")["nosize"]["width"] is None


def test_img2dataset_parquet_prefers_original_size(tmp_path):
    data = make_img2dataset(tmp_path / "i2d")
    assert main(["basic", "--data", str(data / "*.parquet"), "--out", str(tmp_path / "b"), *FAST]) == 0
    rows = _fields(tmp_path / "b")
    assert len(rows) == 8 and {(r["width"], r["height"]) for r in rows.values()} == {(640, 480)}


def test_bad_inputs_one_line(tmp_path, capsys, monkeypatch):
    pq.write_table(pa.table({"key": ["a"], "caption": ["A dog."]}), tmp_path / "nosize.parquet")
    assert main(["basic", "--data", str(tmp_path / "nosize.parquet"), "--out", str(tmp_path / "o1"), *FAST]) == 2
    err = capsys.readouterr().err
    assert "no size columns" in err and "nosize.parquet" in err
    pq.write_table(pa.table({"id": ["a"], "caption": ["A dog."], "width": [1], "height": [1]}), tmp_path / "k.parquet")
    assert main(["basic", "--data", str(tmp_path / "k.parquet"), "--out", str(tmp_path / "o2"), *FAST]) == 2
    assert "no key column (expected one of key, uid" in capsys.readouterr().err
    assert main(["basic", "--data", str(tmp_path / "k.parquet"), "--out", str(tmp_path / "o3"), "--languages", "en",
                 "xx", "--no-progress"]) == 2
    assert "'xx' is not an ISO 639-1 code" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "lingua", None)  # not installed
    data = _shards(tmp_path / "shards")
    assert main(["basic", "--data", str(data), "--out", str(tmp_path / "o4"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'halsift[curate]'" in err and len(err.splitlines()) == 1


def test_rules_count_nulls_and_overlaps():
    t = fields_table(["a", "b", "c"], [("en", 0.9), ("en", 0.9), ("de", 0.9)], ["a b c", "one two three four",
                                                                               "x y"],
                     [(300, 300), None, (100, 900)])
    t, counts = apply_presets(t, ["datacomp"])
    c = counts["datacomp"]
    # a: chars 5 fails; b: no size fails short_side and aspect; c: english, words, chars, short_side, aspect
    assert c["removed"] == {"english": 1, "words": 1, "chars": 2, "short_side": 2, "aspect": 2}
    assert c["removed_only"] == {"english": 0, "words": 0, "chars": 1, "short_side": 0, "aspect": 0}
    assert c["passed"] == 0 and t["pass_datacomp"].to_pylist() == [False, False, False]
    assert [r.name for r in PRESETS["datacomp"]] == ["english", "words", "chars", "short_side", "aspect"]
