"""`halsift export clip-benchmark`: a halsift retrieval set written as CLIP_benchmark's `wds/` layout and read back
the way CLIP_benchmark reads it (its own loader when the `clip-benchmark` extra is installed, else the same
webdataset pipeline as `clip_benchmark/datasets/builder.py: build_wds_dataset`, LAION-AI/CLIP_benchmark@48de38c)."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from halsift.corpus.images import load_image_file
from halsift.corpus.retrieval import read_retrieval
from halsift.launch.cli import main


def clip_benchmark_read(root: Path, split: str = "test") -> tuple[str, list[tuple[Image.Image, list[str]]]]:
    """(dataset type, [(image, captions)]) as CLIP_benchmark's ``wds`` loader yields them."""
    try:
        from clip_benchmark.datasets.builder import build_wds_dataset
    except ImportError:
        build_wds_dataset = None
    if build_wds_dataset is not None:
        ds = build_wds_dataset("halsift", transform=lambda im: im, split=split, data_dir=str(root))
        kind = (root / "dataset_type.txt").read_text().strip().lower()
        return kind, list(ds)
    import webdataset as wds

    nshards = int((root / split / "nshards.txt").read_text())  # mandatory, as there
    kind = (root / "dataset_type.txt").read_text().strip().lower()
    ds = (wds.WebDataset(os.path.join(root, split, "{0..%d}.tar" % (nshards - 1)), nodesplitter=lambda src: src)
          .decode(wds.autodecode.ImageHandler("pil", extensions=["webp", "png", "jpg", "jpeg"])))
    if kind == "retrieval":
        ds = ds.to_tuple(["webp", "png", "jpg", "jpeg"], "txt").map_tuple(lambda im: im, str.splitlines)
    return kind, list(ds)


def _rgb(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"))  # what CLIP_benchmark's transform (open_clip's preprocess) starts from


@pytest.fixture
def retrieval(tmp_path) -> Path:
    """Five images in the forms a user has (plain JPEG and PNG; an RGBA PNG, a BMP and an EXIF-rotated JPEG that
    CLIP_benchmark would decode differently or not at all); captions with CR/LF and Unicode line separators."""
    rng = np.random.default_rng(0)
    d = tmp_path / "set"
    (d / "images").mkdir(parents=True)

    def arr(c: int = 3) -> np.ndarray:
        return rng.integers(0, 256, (24, 40, c), dtype=np.uint8)

    Image.fromarray(arr()).save(d / "images" / "plain.jpg", quality=90)
    Image.fromarray(arr()).save(d / "images" / "plain.png")
    Image.fromarray(arr(4)).save(d / "images" / "alpha.png")
    Image.fromarray(arr()).save(d / "images" / "old.bmp")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    Image.fromarray(arr()).save(d / "images" / "rotated.jpg", exif=exif, quality=90)
    rows = [("plain.jpg", ["A red dog.", "A dog\r\non grass."]), ("plain.png", ["Noise."]),
            ("alpha.png", ["See-through\u2028noise.", "Two lines\n\nhere.", "Third."]), ("old.bmp", ["A bitmap."]),
            ("rotated.jpg", ["Turned."])]
    (d / "retrieval.jsonl").write_text("".join(json.dumps({"image": f"images/{n}", "captions": c}) + "\n"
                                               for n, c in rows))
    return d


def test_export_reads_back_in_clip_benchmark_with_halsifts_pixels_and_captions(retrieval, tmp_path, capsys):
    out = tmp_path / "cb"
    assert main(["export", "clip-benchmark", str(retrieval), "--out", str(out), "--maxcount", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["images"] == 5 and summary["shards"] == 3 and summary["reencoded"] == 3
    assert summary["captions"] == 8 and summary["captions_with_line_breaks"] == 3
    assert "--task zeroshot_retrieval" in summary["clip_benchmark"]
    assert sorted(p.name for p in (out / "test").iterdir()) == ["0.tar", "1.tar", "2.tar", "nshards.txt"]

    kind, got = clip_benchmark_read(out)
    rs = read_retrieval(retrieval)
    assert kind == "retrieval" and len(got) == len(rs)
    for (img, caps), path, want in zip(got, rs.images, rs.captions):
        np.testing.assert_array_equal(_rgb(img), np.asarray(load_image_file(path)), err_msg=path.name)
        assert len(caps) == len(want)  # one line per caption: none split, none merged
        assert caps == [" ".join(c.split()) for c in want]  # line breaks became spaces (these have no others)
    with tarfile.open(out / "test" / "0.tar") as tar:  # plain files are copied byte for byte
        assert tar.extractfile("s0000000.jpg").read() == (retrieval / "images" / "plain.jpg").read_bytes()
        assert tar.extractfile("s0000001.png").read() == (retrieval / "images" / "plain.png").read_bytes()


def test_rerun_is_byte_identical_splits_share_a_root_and_nothing_is_overwritten(retrieval, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["export", "clip-benchmark", str(retrieval / "retrieval.jsonl"), "--out", str(a)]) == 0
    assert main(["export", "clip-benchmark", str(retrieval), "--out", str(b)]) == 0
    assert (a / "test" / "0.tar").read_bytes() == (b / "test" / "0.tar").read_bytes()
    assert (a / "test" / "nshards.txt").read_text() == "1\n"
    capsys.readouterr()

    assert main(["export", "clip-benchmark", str(retrieval), "--out", str(a)]) == 2
    assert "already exists; choose another --out or --split" in capsys.readouterr().err
    assert main(["export", "clip-benchmark", str(retrieval), "--out", str(a), "--split", "val"]) == 0
    assert len(clip_benchmark_read(a, "val")[1]) == len(clip_benchmark_read(a, "test")[1]) == 5
    assert not [p for p in a.iterdir() if p.name.startswith(".")]  # no temporary folder or lock left

    (b / "dataset_type.txt").write_text("multilabel\n")  # a classification root is not extended with retrieval
    assert main(["export", "clip-benchmark", str(retrieval), "--out", str(b), "--split", "train"]) == 2
    assert "says 'multilabel', not 'retrieval'" in capsys.readouterr().err
    assert not (b / "train").exists()
    assert main(["export", "clip-benchmark", str(retrieval), "--out", str(b), "--split", "../up"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--split: '../up' is not a plain folder name" in err


def test_an_image_halsift_cannot_decode_is_named_and_nothing_is_written(retrieval, tmp_path, capsys):
    (retrieval / "images" / "plain.png").write_bytes(b"\x89PNG\r\n\x1a\n but not really")
    out = tmp_path / "cb"
    out.mkdir()  # an existing, empty folder: kept, and left empty
    assert main(["export", "clip-benchmark", str(retrieval), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "plain.png" in err
    assert list(out.iterdir()) == []  # no split folder, dataset_type.txt or temporary folder
