"""Retrieval set reader/writer and the COCO / Karpathy / Flickr converters on hand-made fixtures."""

from __future__ import annotations

import json
import re

import pytest

from halsift.corpus.retrieval import (RetrievalFormatError, from_coco, from_flickr, read_retrieval,
                                      write_retrieval)


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG fake")  # converters and reader check existence, not pixels
    return path


def test_round_trip_resolves_images(tmp_path):
    _touch(tmp_path / "images" / "a.png")
    _touch(tmp_path / "images" / "b.png")
    rows = [{"image": "images/a.png", "captions": ["a red cube.", "a cube."]},
            {"image": "images/b.png", "captions": ["two dogs."], "split": "test"}]
    assert write_retrieval(tmp_path / "retrieval.jsonl", rows) == 2
    rs = read_retrieval(tmp_path / "retrieval.jsonl")
    assert len(rs) == 2
    assert rs.images == [(tmp_path / "images" / "a.png").resolve(), (tmp_path / "images" / "b.png").resolve()]
    assert rs.captions == [["a red cube.", "a cube."], ["two dogs."]]
    assert rs.flat_captions() == (["a red cube.", "a cube.", "two dogs."], [0, 0, 1])
    assert read_retrieval(tmp_path).captions == rs.captions  # a folder means folder/retrieval.jsonl
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []


@pytest.mark.parametrize("line, needle", [
    ('{"image": "images/a.png", "captions": ["x"]', "not valid JSON"),
    ('["images/a.png"]', "expected a JSON object"),
    ('{"captions": ["x"]}', "field 'image' is missing"),
    ('{"image": 3, "captions": ["x"]}', "field 'image'"),
    ('{"image": "images/a.png"}', "field 'captions' is missing"),
    ('{"image": "images/a.png", "captions": "x"}', "field 'captions'"),
    ('{"image": "images/a.png", "captions": []}', "field 'captions'"),
    ('{"image": "images/a.png", "captions": ["ok", ""]}', "field 'captions[1]'"),
    ('{"image": "images/nope.png", "captions": ["x"]}', "no such file"),
])
def test_errors_name_file_line_and_field(tmp_path, line, needle):
    _touch(tmp_path / "images" / "a.png")
    _touch(tmp_path / "images" / "b.png")
    p = tmp_path / "retrieval.jsonl"
    p.write_text('{"image": "images/b.png", "captions": ["fine"]}\n' + line + "\n")
    with pytest.raises(RetrievalFormatError, match="^" + re.escape(f"{p}:2: ") + ".*" + re.escape(needle)) as ei:
        read_retrieval(p)
    assert f"{p}:2" in str(ei.value) and needle in str(ei.value)


def test_repeated_image_is_an_error(tmp_path):
    _touch(tmp_path / "a.png")
    p = tmp_path / "r.jsonl"
    p.write_text('{"image": "a.png", "captions": ["x"]}\n\n{"image": "a.png", "captions": ["y"]}\n')
    with pytest.raises(RetrievalFormatError, match=r"r.jsonl:3: field 'image' 'a.png' repeats line 1"):
        read_retrieval(p)


def test_write_validates_and_leaves_no_temp(tmp_path):
    with pytest.raises(RetrievalFormatError, match=r"out.jsonl:2: field 'captions'"):
        write_retrieval(tmp_path / "out.jsonl", [{"image": "a", "captions": ["x"]}, {"image": "b", "captions": []}])
    assert list(tmp_path.iterdir()) == []


def test_from_coco_captions_json(tmp_path):
    coco = {
        "images": [{"id": 9, "file_name": "COCO_val2014_000000000009.jpg"},
                   {"id": 25, "file_name": "COCO_val2014_000000000025.jpg"},
                   {"id": 30, "file_name": "missing.jpg"}],
        "annotations": [{"id": 1, "image_id": 9, "caption": "A plate of food. "},
                        {"id": 2, "image_id": 25, "caption": "A giraffe eating."},
                        {"id": 3, "image_id": 9, "caption": "Food on a plate."},
                        {"id": 4, "image_id": 30, "caption": "Nothing."}],
    }
    (tmp_path / "captions_val2014.json").write_text(json.dumps(coco))
    _touch(tmp_path / "val2014" / "COCO_val2014_000000000009.jpg")
    _touch(tmp_path / "val2014" / "COCO_val2014_000000000025.jpg")
    out = tmp_path / "ret" / "retrieval.jsonl"
    summary = from_coco(tmp_path / "captions_val2014.json", tmp_path / "val2014", out)
    assert summary["images"] == 2 and summary["captions"] == 3 and summary["missing_images"] == 1
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0] == {"image": "../val2014/COCO_val2014_000000000009.jpg",
                       "captions": ["A plate of food.", "Food on a plate."], "image_id": "9"}
    rs = read_retrieval(out)
    assert rs.images[1].name == "COCO_val2014_000000000025.jpg" and rs.captions[1] == ["A giraffe eating."]
    with pytest.raises(ValueError, match="karpathy"):
        from_coco(tmp_path / "captions_val2014.json", tmp_path / "val2014", out, split="test")


def test_from_coco_bad_annotation_names_field(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"images": [], "annotations": [{"image_id": 1}]}))
    with pytest.raises(RetrievalFormatError, match=r"annotations\[0\]: field 'caption' is missing"):
        from_coco(tmp_path / "c.json", tmp_path, tmp_path / "r.jsonl")


def test_from_coco_karpathy_split(tmp_path):
    def im(split, name, sub, n):
        return {"split": split, "filepath": sub, "filename": name, "cocoid": len(name),
                "sentences": [{"raw": f"{name} caption {i}.", "tokens": []} for i in range(n)]}
    kp = {"dataset": "coco", "images": [im("train", "t1.jpg", "train2014", 5), im("test", "x1.jpg", "val2014", 6),
                                        im("restval", "r1.jpg", "val2014", 5), im("test", "x2.jpg", "val2014", 5)]}
    (tmp_path / "dataset_coco.json").write_text(json.dumps(kp))
    for sub, name in [("train2014", "t1.jpg"), ("val2014", "x1.jpg"), ("val2014", "r1.jpg"), ("val2014", "x2.jpg")]:
        _touch(tmp_path / "coco" / sub / name)
    out = tmp_path / "retrieval.jsonl"
    s = from_coco(None, tmp_path / "coco", out, split="test", karpathy_json=tmp_path / "dataset_coco.json",
                  max_captions=5)
    assert s["images"] == 2 and s["captions"] == 10
    rs = read_retrieval(out)
    assert [p.name for p in rs.images] == ["x1.jpg", "x2.jpg"]
    assert rs.captions[0] == [f"x1.jpg caption {i}." for i in range(5)]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["split"] for r in rows} == {"test"} and rows[0]["image"] == "coco/val2014/x1.jpg"
    s = from_coco(None, tmp_path / "coco", out, split="train,restval", karpathy_json=tmp_path / "dataset_coco.json")
    assert [p.name for p in read_retrieval(out).images] == ["t1.jpg", "r1.jpg"]


FLICKR8K_TOKENS = (
    "1000268201_693b08cb0e.jpg#1\tA girl going into a wooden building .\n"
    "1000268201_693b08cb0e.jpg#0\tA child in a pink dress is climbing up a set of stairs in an entry way .\n"
    "1001773457_577c3a7d70.jpg#0\tA black dog and a spotted dog are fighting\n"
    "1001773457_577c3a7d70.jpg#1\tA black dog and a tri-colored dog playing with each other on the road .\n"
    "2258277193_586949ec62.jpg.1#0\tThis image is not on disk .\n"
)


def test_from_flickr8k_token_file_and_split(tmp_path):
    (tmp_path / "Flickr8k.token.txt").write_text(FLICKR8K_TOKENS)
    for n in ("1000268201_693b08cb0e.jpg", "1001773457_577c3a7d70.jpg"):
        _touch(tmp_path / "Flicker8k_Dataset" / n)
    out = tmp_path / "retrieval.jsonl"
    s = from_flickr(tmp_path / "Flickr8k.token.txt", tmp_path / "Flicker8k_Dataset", out)
    assert (s["images"], s["captions"], s["missing_images"]) == (2, 4, 1)
    rs = read_retrieval(out)
    assert rs.captions[0] == ["A child in a pink dress is climbing up a set of stairs in an entry way .",
                              "A girl going into a wooden building ."]  # ordered by #N
    (tmp_path / "Flickr_8k.testImages.txt").write_text("1001773457_577c3a7d70.jpg\n")
    from_flickr(tmp_path / "Flickr8k.token.txt", tmp_path / "Flicker8k_Dataset", out,
                split_file=tmp_path / "Flickr_8k.testImages.txt")
    assert [p.name for p in read_retrieval(out).images] == ["1001773457_577c3a7d70.jpg"]


def test_from_flickr_bad_token_line_names_line(tmp_path):
    (tmp_path / "t.token").write_text(FLICKR8K_TOKENS + "garbage without a tab\n")
    with pytest.raises(RetrievalFormatError, match=r"t.token:6: expected 'image.jpg#N<TAB>caption'"):
        from_flickr(tmp_path / "t.token", tmp_path, tmp_path / "r.jsonl")


def test_from_flickr30k_token_and_csv_agree(tmp_path):
    token = ("1000092795.jpg#0\tTwo young guys with shaggy hair look at their hands .\n"
             "1000092795.jpg#1\tTwo young , White males are outside near many bushes .\n"
             "10002456.jpg#0\tSeveral men in hard hats are operating a giant pulley system .\n")
    csv_text = ("image_name| comment_number| comment\n"
                "1000092795.jpg| 0| Two young guys with shaggy hair look at their hands .\n"
                "1000092795.jpg| 1| Two young , White males are outside near many bushes .\n"
                "10002456.jpg| 0| Several men in hard hats are operating a giant pulley system .\n")
    (tmp_path / "results_20130124.token").write_text(token)
    (tmp_path / "results.csv").write_text(csv_text)
    for n in ("1000092795.jpg", "10002456.jpg"):
        _touch(tmp_path / "flickr30k-images" / n)
    a = from_flickr(tmp_path / "results_20130124.token", tmp_path / "flickr30k-images", tmp_path / "a.jsonl")
    b = from_flickr(tmp_path / "results.csv", tmp_path / "flickr30k-images", tmp_path / "b.jsonl")
    assert a == b and a["captions"] == 3
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    assert read_retrieval(tmp_path / "b.jsonl").captions[1] == [
        "Several men in hard hats are operating a giant pulley system ."]
    (tmp_path / "bad.csv").write_text("image_name| comment_number| comment\n10002456.jpg  Several men\n")
    with pytest.raises(RetrievalFormatError, match=r"bad.csv:2: expected 'image_name\| comment_number\| comment'"):
        from_flickr(tmp_path / "bad.csv", tmp_path / "flickr30k-images", tmp_path / "c.jsonl")


def test_from_flickr8k_kaggle_csv(tmp_path):
    (tmp_path / "captions.txt").write_text('image,caption\n1.jpg,"A dog, running ."\n1.jpg,A dog .\n')
    _touch(tmp_path / "Images" / "1.jpg")
    from_flickr(tmp_path / "captions.txt", tmp_path / "Images", tmp_path / "r.jsonl")
    assert read_retrieval(tmp_path / "r.jsonl").captions == [["A dog, running .", "A dog ."]]
