"""`halsift convert` and the inputs score/select refuse in one line (tables, folders, URLs, pipes)."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from img2dataset_data import jpeg, make_img2dataset

from halsift.corpus.shards import META_DEFAULTS, iter_samples, read_sizes
from halsift.launch.cli import main


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("kind", ["parquet", "pipe", "s3", "folder"])
def test_score_refuses_what_it_cannot_read(tmp_path, capsys, kind):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(jpeg(random.Random(0)))
    pq.write_table(pa.table({"image": ["imgs/a.jpg"], "caption": ["A cat."]}), tmp_path / "t.parquet")
    data = {"parquet": str(tmp_path / "t.parquet"), "pipe": f"pipe:cat {tmp_path}/x.tar",
            "s3": "s3://bucket/shards/{00000..00009}.tar", "folder": str(tmp_path / "imgs")}[kind]
    assert main(["score", "--detector", "random:seed=0", "--data", data, "--out", str(tmp_path / "sc"),
                 "--no-progress"]) == 2
    assert "halsift convert" in _err(capsys)
    assert not (tmp_path / "sc").exists() or not any((tmp_path / "sc").glob("*.parquet"))


def _score_select(data, tmp_path) -> list:
    assert main(["score", "--detector", "random:seed=0", "--data", str(data), "--out", str(tmp_path / "sc"),
                 "--no-progress"]) == 0
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--unit", "caption", "--no-progress"]) == 0
    return list(iter_samples(tmp_path / "sel"))


def test_convert_parquet_table_bytes_and_hf_struct(tmp_path, capsys):
    rng = random.Random(0)
    rows = {"image": [{"bytes": jpeg(rng), "path": f"p{i}.jpg"} for i in range(3)] + [{"bytes": None, "path": None}],
            "caption": ["A red dog.", "A blue car. It is parked.", "", "A tree."], "uid": ["u0", "u1", "u2", "u3"],
            "similarity": [0.3, 0.2, 0.1, 0.4]}
    pq.write_table(pa.table(rows), tmp_path / "t.parquet")
    assert main(["convert", "table", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "sh"), "--key-col", "uid",
                 "--captioner", "laion"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["samples"] == 2 and summary["skipped"] == {"empty_caption": 1, "missing_image": 1}
    got = {s.key: s for s in iter_samples(tmp_path / "sh")}
    assert set(got) == {"u0", "u1"} and read_sizes(tmp_path / "sh") == {"000000.tar": 2}
    assert got["u1"].caption == "A blue car. It is parked." and got["u1"].meta["similarity"] == 0.2
    assert got["u0"].meta["captioner"] == "laion" and got["u0"].meta["source"] == "i2t"
    assert len(_score_select(tmp_path / "sh", tmp_path)) == 1


def test_convert_jsonl_with_paths_and_bad_column(tmp_path, capsys):
    rng = random.Random(1)
    (tmp_path / "im").mkdir()
    for i in range(2):
        (tmp_path / "im" / f"{i}.png").write_bytes(jpeg(rng))
    lines = [{"file": "im/0.png", "text": "One."}, {"file": "im/1.png", "text": "Two."},
             {"file": "im/missing.png", "text": "Three."}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["convert", "table", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "bad")]) == 2
    assert "no column 'image'" in _err(capsys)
    assert main(["convert", "table", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "sh"), "--image-col", "file",
                 "--caption-col", "text"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["samples"] == 2 and summary["skipped"] == {"missing_image": 1}
    assert [s.caption for s in iter_samples(tmp_path / "sh")] == ["One.", "Two."]


def test_convert_hf_save_to_disk_folder(tmp_path, capsys):
    """The layout Dataset.save_to_disk writes: Arrow stream file(s) + state.json + dataset_info.json."""
    rng = random.Random(2)
    d = tmp_path / "hf"
    d.mkdir()
    t = pa.table({"image": [{"bytes": jpeg(rng), "path": None} for _ in range(3)],
                  "caption": [f"Picture {i}." for i in range(3)]})
    with pa.OSFile(str(d / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
        w.write_table(t)
    (d / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                                              "_fingerprint": "x", "_format_type": None, "_split": "train"}))
    (d / "dataset_info.json").write_text("{}")
    assert main(["convert", "hf", str(d), "--out", str(tmp_path / "sh")]) == 0
    assert [s.caption for s in iter_samples(tmp_path / "sh")] == ["Picture 0.", "Picture 1.", "Picture 2."]
    assert main(["convert", "hf", str(tmp_path / "sh"), "--out", str(tmp_path / "x")]) == 2
    assert "not a Hugging Face save_to_disk folder" in _err(capsys)


def test_convert_image_folder_with_sidecars(tmp_path, capsys):
    rng = random.Random(3)
    d = tmp_path / "photos" / "sub"
    d.mkdir(parents=True)
    for name in ("a", "b", "c"):
        (d / f"{name}.jpg").write_bytes(jpeg(rng))
    (d / "a.txt").write_text("A dog on a sofa.\n")
    (d / "b.txt").write_text("A cat.")
    (d / "b.json").write_text(json.dumps({"captioner": "human", "source": "i2t"}))
    assert main(["convert", "folder", str(tmp_path / "photos"), "--out", str(tmp_path / "sh")]) == 0
    got = {s.key: s for s in iter_samples(tmp_path / "sh")}
    assert set(got) == {"sub_a", "sub_b"}  # c has no caption: skipped and counted
    assert json.loads(capsys.readouterr().out.splitlines()[0])["skipped"] == {"empty_caption": 1}
    assert got["sub_b"].meta["captioner"] == "human" and got["sub_a"].meta["captioner"] == "unknown"
    assert got["sub_a"].caption == "A dog on a sofa."


def test_convert_piped_img2dataset_then_score_select(tmp_path, capsys):
    src = make_img2dataset(tmp_path / "i2d")
    assert main(["convert", "webdataset", f"pipe:cat {src}/{{00000..00001}}.tar", "--out", str(tmp_path / "sh"),
                 "--captioner", "alt-text", "--maxcount", "5"]) == 0
    assert read_sizes(tmp_path / "sh") == {"000000.tar": 5, "000001.tar": 3}
    kept = _score_select(tmp_path / "sh", tmp_path)
    assert len(kept) == 4 and {s.meta["captioner"] for s in kept} == {"alt-text"}
    assert main(["convert", "img2dataset", str(src), "--out", str(tmp_path / "sh2")]) == 0
    want = _tar_members(src)
    for folder, captioner in (("sh", "alt-text"), ("sh2", META_DEFAULTS["captioner"])):
        got = {s.key: s for s in iter_samples(tmp_path / folder)}
        assert list(got) == list(want), folder  # every sample, in order
        for key, (jpg, txt, meta) in want.items():
            s = got[key]
            assert (s.image, s.caption, s.ext) == (jpg, txt, "jpg"), key
            assert {k: s.meta[k] for k in meta} == meta and s.meta["captioner"] == captioner, key
    capsys.readouterr()
    assert main(["convert", "webdataset", f"pipe:cat {tmp_path}/nope.tar", "--out", str(tmp_path / "sh3")]) == 2
    assert "cannot read these shards" in _err(capsys)


def _tar_members(folder) -> dict:
    """``key -> (jpg bytes, txt, json)`` of a folder's tars, read with the standard library's tarfile."""
    import tarfile

    out: dict = {}
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                key, ext = m.name.split(".", 1)
                out.setdefault(key, {})[ext] = t.extractfile(m).read()
    return {k: (v["jpg"], v["txt"].decode(), json.loads(v["json"])) for k, v in out.items()}


def test_convert_coco_and_flickr(tmp_path, capsys):
    rng = random.Random(4)
    (tmp_path / "im").mkdir()
    (tmp_path / "im" / "1.jpg").write_bytes(jpeg(rng))
    (tmp_path / "cap.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "1.jpg"}],
                                                   "annotations": [{"image_id": 1, "caption": "A bird."}]}))
    assert main(["convert", "coco", str(tmp_path / "cap.json"), "--images", str(tmp_path / "im"),
                 "--out", str(tmp_path / "coco.jsonl")]) == 0
    assert json.loads((tmp_path / "coco.jsonl").read_text())["captions"] == ["A bird."]
    (tmp_path / "tok.txt").write_text("1.jpg#0\tA bird.\n1.jpg#1\tA small bird.\n")
    assert main(["convert", "flickr", str(tmp_path / "tok.txt"), "--images", str(tmp_path / "im"),
                 "--out", str(tmp_path / "fl.jsonl")]) == 0
    assert json.loads((tmp_path / "fl.jsonl").read_text())["captions"] == ["A bird.", "A small bird."]
    assert main(["convert", "coco", str(tmp_path / "cap.json"), "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--images" in _err(capsys)
