"""Benchmark JSONL: round trip, and every schema error names file:line and the field."""

from __future__ import annotations

import json
import re

import pytest

from halsift.corpus.bench import BenchFormatError, BenchRow, image_path, read_bench, write_bench


def _row(i: int = 0, **kw) -> dict:
    d = {"id": f"r{i}", "image": "images/a.png", "image_id": "a", "generator": "cap-terse", "generator_type": "i2t",
         "domain": "plain", "caption_id": "a-cap", "position": i, "sentence": "Two red cubes face left.",
         "caption": "Two red cubes face left.", "label": "incorrect", "types": ["Number", "Direction"],
         "spans": [[0, 1], [3, 5]], "split": "val"}
    d.update(kw)
    return d


def test_round_trip_keeps_fields_and_extra(tmp_path):
    rows = [BenchRow(**_row(0)), _row(1, label="correct", types=[], spans=[], n_correct=4, note={"a": 1})]
    p = tmp_path / "bench" / "bench.jsonl"
    assert write_bench(p, rows) == 2
    back = read_bench(p)
    assert back[0] == BenchRow(**_row(0))
    assert back[1].label == "correct" and back[1].extra == {"n_correct": 4, "note": {"a": 1}}
    assert [r.to_json() for r in back] == [BenchRow(**_row(0)).to_json(), _row(1, label="correct", types=[], spans=[],
                                                                                 n_correct=4, note={"a": 1})]
    assert image_path(p, back[0]) == tmp_path / "bench" / "images" / "a.png"
    write_bench(tmp_path / "again.jsonl", back)
    assert (tmp_path / "again.jsonl").read_text() == p.read_text()
    assert [x.name for x in p.parent.iterdir()] == ["bench.jsonl"]  # no temp file left


def test_optional_fields_default(tmp_path):
    d = _row(0)
    for k in ("types", "spans", "split"):
        d.pop(k)
    p = tmp_path / "b.jsonl"
    p.write_text(json.dumps(d) + "\n")
    (r,) = read_bench(p)
    assert (r.types, r.spans, r.split) == ([], [], "test")


def test_extra_cannot_override_schema_fields():
    r = BenchRow(**_row(0))
    r.extra = {"label": "correct", "votes": 3}
    assert r.to_json()["label"] == "incorrect" and r.to_json()["votes"] == 3


BAD = [
    (lambda d: d.pop("sentence"), "field 'sentence' is missing"),
    (lambda d: d.pop("label"), "field 'label' is missing"),
    (lambda d: d.update(position="2"), "field 'position' is str"),
    (lambda d: d.update(position=True), "field 'position' is bool"),
    (lambda d: d.update(position=-1), "field 'position' is -1"),
    (lambda d: d.update(types="Number"), "field 'types' is str"),
    (lambda d: d.update(image=None), "field 'image' is NoneType"),
    (lambda d: d.update(label="wrong"), "field 'label' is 'wrong'"),
    (lambda d: d.update(generator_type="x2y"), "field 'generator_type' is 'x2y'"),
    (lambda d: d.update(split="dev"), "field 'split' is 'dev'"),
    (lambda d: d.update(types=["Colour"]), "field 'types' has ['Colour']"),
    (lambda d: d.update(sentence="  "), "field 'sentence' is empty"),
    (lambda d: d.update(spans=[[2, 1]]), "field 'spans' has [2, 1]"),
    (lambda d: d.update(spans=[[0, 6]]), "field 'spans' has [0, 6]"),  # the sentence has 5 words
    (lambda d: d.update(spans=[[0]]), "field 'spans' has [0]"),
    (lambda d: d.update(spans=[[0.0, 1]]), "field 'spans' has [0.0, 1]"),
    (lambda d: d.update(spans=[[-1, 1]]), "field 'spans' has [-1, 1]"),
]


@pytest.mark.parametrize("mutate, needle", BAD, ids=[b[1] for b in BAD])
def test_schema_errors_name_file_line_and_field(tmp_path, mutate, needle):
    bad = _row(1)
    mutate(bad)
    p = tmp_path / "bench.jsonl"
    p.write_text(json.dumps(_row(0)) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(BenchFormatError, match="^" + re.escape(f"{p}:3: ") + ".*" + re.escape(needle)) as ei:
        read_bench(p)
    assert str(ei.value).startswith(f"{p}:3: ") and needle in str(ei.value)


def test_span_at_sentence_end_is_valid(tmp_path):
    p = tmp_path / "b.jsonl"
    write_bench(p, [_row(0, spans=[[4, 5]])])
    assert read_bench(p)[0].spans == [[4, 5]]


def test_invalid_json_and_non_object(tmp_path):
    p = tmp_path / "bench.jsonl"
    p.write_text(json.dumps(_row(0)) + "\n" + '{"id": "r1", ' + "\n")
    with pytest.raises(BenchFormatError, match=rf"^{p}:2: not valid JSON"):
        read_bench(p)
    p.write_text("[1, 2]\n")
    with pytest.raises(BenchFormatError, match=rf"^{p}:1: expected a JSON object, got list"):
        read_bench(p)


def test_duplicate_id(tmp_path):
    p = tmp_path / "bench.jsonl"
    p.write_text(json.dumps(_row(0)) + "\n" + json.dumps(_row(0, position=3)) + "\n")
    with pytest.raises(BenchFormatError, match=rf"^{p}:2: field 'id' 'r0' repeats an earlier row"):
        read_bench(p)


def test_write_validates_and_is_atomic(tmp_path):
    p = tmp_path / "bench.jsonl"
    write_bench(p, [_row(0)])
    before = p.read_text()
    with pytest.raises(BenchFormatError, match=rf"^{p}:2: field 'label'"):
        write_bench(p, [_row(0), _row(1, label="nope")])
    with pytest.raises(BenchFormatError, match=rf"^{p}:2: field 'id' 'r0' repeats"):
        write_bench(p, [_row(0), _row(0)])
    assert p.read_text() == before  # the old file is untouched
    assert [x.name for x in tmp_path.iterdir()] == ["bench.jsonl"]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_bench(tmp_path / "nope.jsonl")


def test_with_shuffled_images_is_a_seeded_derangement():
    from halsift.corpus.bench import validate_row, with_shuffled_images

    rows = [validate_row({**_row(i), "image": f"images/{i // 2}.png", "image_id": str(i // 2)}, "t") for i in range(10)]
    got = with_shuffled_images(rows, seed=3)
    assert [r.id for r in got] == [r.id for r in rows] and [r.sentence for r in got] == [r.sentence for r in rows]
    assert all(a.image != b.image for a, b in zip(rows, got))  # no row keeps its image
    pairs = {(a.image, b.image) for a, b in zip(rows, got)}
    assert len(pairs) == 5 and len({b for _, b in pairs}) == 5  # each image maps to one other image, a bijection
    assert with_shuffled_images(rows, seed=3) == got and with_shuffled_images(rows, seed=4) != got
    with pytest.raises(ValueError, match="at least two distinct images"):
        with_shuffled_images(rows[:2])


def test_read_bench_reads_each_version_of_a_file_once_and_hands_each_caller_its_own_rows(tmp_path, monkeypatch):
    import halsift.corpus.bench as bench

    p = tmp_path / "b" / "bench.jsonl"
    write_bench(p, [_row(0), _row(1)])
    reads = []
    real = bench.iter_bench
    monkeypatch.setattr(bench, "iter_bench", lambda path: reads.append(path) or real(path))
    first = read_bench(p)
    first[0].label = "correct"  # a caller's change stays its own
    first.pop()
    again = read_bench(p)
    assert len(reads) == 1 and [r.label for r in again] == ["incorrect", "incorrect"]
    write_bench(p, [_row(0), _row(1), _row(2)])  # a new version of the file: read again
    assert len(read_bench(p)) == 3 and len(reads) == 2
    # an image outside the bench folder is valid while image_roots.json lists its folder: read again without it
    (p.parent / "image_roots.json").write_text(json.dumps([str(tmp_path / "elsewhere")]))
    p.write_text(json.dumps(_row(0, image="../elsewhere/a.png")) + "\n")
    assert [r.image for r in read_bench(p)] == ["../elsewhere/a.png"]
    (p.parent / "image_roots.json").unlink()
    with pytest.raises(BenchFormatError, match="outside the bench folder"):
        read_bench(p)
