"""The AlignBench / HalCap-Bench HF release (halcap_bench.jsonl) in its published column layout."""

from __future__ import annotations

import json
import random

from img2dataset_data import jpeg

from halsift.corpus.alignbench import generator_type
from halsift.corpus.bench import image_path, read_bench
from halsift.launch.cli import main

# the dataset card's columns, in its order
RELEASE_COLUMNS = ["model", "image_source", "image_name", "image_type", "sentence_index", "caption", "annotation",
                   "error_type", "error_words", "agreement_ratio", "fleiss_Pi", "n_correct", "n_incorrect",
                   "n_unknown", "image_url", "image_path_in_repo"]

CAPTIONS = {  # (model, image_source, image_name, image_type, repo path or None, url or None) -> sentences
    ("gpt4o", "coco", "000000000139.jpg", "natural", None,
     "http://images.cocodataset.org/val2017/000000000139.jpg"): ["A living room with a green sofa.",
                                                                  "Two lamps stand by the window."],
    ("sharegpt", "cc12m", "cc_42.jpg", "natural", None, "https://cc12m.example/cc_42.jpg"):
        ["A dog runs on a beach.", "The sky is clear."],
    ("sd", "data_generation", "0.png", "generated", "images/data_generation/sd/0.png", None):
        ["An alpaca stands on the left.", "It gazes to the right."],
    ("gpt4o-imagen", "data_generation", "0.png", "generated", "images/data_generation/gpt4o-imagen/0.png", None):
        ["A cup of tea rests on the arm rest.", "Steam rises from it."],
}


def _write_release(root, whole_caption: bool = False):
    """halcap_bench.jsonl + images/ as in the repo; COCO images in a local mirror, the CC12M one absent."""
    rng = random.Random(0)
    lines = []
    for (model, src, name, itype, repo_path, url), sents in CAPTIONS.items():
        if repo_path:
            (root / repo_path).parent.mkdir(parents=True, exist_ok=True)
            (root / repo_path).write_bytes(jpeg(rng))
        for i, s in enumerate(sents):
            wrong = i == 1
            lines.append(dict(zip(RELEASE_COLUMNS, [
                model, src, name, itype, i, " ".join(sents) if whole_caption else s,
                "incorrect" if wrong else "correct", "Direction" if wrong else None,
                s.split()[1] if wrong else None, 0.8, 0.61, 1 if wrong else 5, 4 if wrong else 0, 0, url,
                repo_path])))
    (root / "halcap_bench.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    mirror = root.parent / "mirror"
    mirror.mkdir(exist_ok=True)
    (mirror / "000000000139.jpg").write_bytes(jpeg(rng))
    return root / "halcap_bench.jsonl", mirror


def test_release_generator_types():
    assert [generator_type(m) for m in ("sharegpt", "llama-4", "gpt4o", "sd", "cogvlm", "llava", "gpt4o-imagen",
                                        "qwen")] == ["i2t", "i2t", "i2t", "t2i", "i2t", "i2t", "t2i", "i2t"]


def _convert(tmp_path, capsys, whole: bool):
    repo = tmp_path / "AlignBench"
    repo.mkdir()
    table, mirror = _write_release(repo, whole_caption=whole)
    out = tmp_path / "bench" / "bench.jsonl"
    assert main(["convert", "alignbench", str(table), "--images", str(mirror), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    return summary, {r.id: r for r in read_bench(out)}, out


def test_release_rows_images_and_types(tmp_path, capsys):
    summary, rows, out = _convert(tmp_path, capsys, whole=False)
    assert summary["caption_column"] == "sentence"
    assert summary["generator_types"] == {"gpt4o": "i2t", "gpt4o-imagen": "t2i", "sd": "t2i"}
    # the CC12M rows have only an image_url and no local copy: left out and counted, with the URL to fetch
    assert summary["rows"] == 6 and summary["rows_missing_image"] == 2
    assert "https://cc12m.example/cc_42.jpg" in summary["missing_image_examples"][0]
    assert not any(r.generator == "sharegpt" for r in rows.values())
    for r in rows.values():
        assert image_path(out, r).is_file() and r.image not in ("", ".")
    assert rows["gpt4o-imagen-0-0"].image.endswith("images/data_generation/gpt4o-imagen/0.png")
    assert rows["sd-0-1"].image.endswith("images/data_generation/sd/0.png")
    assert rows["gpt4o-000000000139-0"].image.endswith("mirror/000000000139.jpg")
    g = rows["gpt4o-000000000139-1"]
    assert g.generator_type == "i2t" and g.label == "incorrect" and g.types == ["Direction"]
    assert g.caption == "A living room with a green sofa. Two lamps stand by the window."
    assert g.extra["fleiss_Pi"] == 0.61 and g.extra["image_url"].startswith("http://images.cocodataset.org/")


def test_release_whole_caption_column_is_detected(tmp_path, capsys):
    summary, rows, _ = _convert(tmp_path, capsys, whole=True)
    assert summary["caption_column"] == "whole caption" and summary["captions_split_mismatch"] == 0
    r = rows["sd-0-1"]
    assert r.sentence == "It gazes to the right."
    assert r.caption == "An alpaca stands on the left. It gazes to the right."
    assert r.spans == [[1, 2]] and r.generator_type == "t2i"


def test_release_without_any_image_is_exit_2(tmp_path, capsys):
    repo = tmp_path / "AlignBench"
    repo.mkdir()
    table, _ = _write_release(repo)
    for p in (repo / "images").rglob("*.png"):
        p.unlink()
    assert main(["convert", "alignbench", str(table), "--out", str(tmp_path / "b.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no row could be converted (e.g. image not found under" in err
    assert not (tmp_path / "b.jsonl").exists()
