"""VIGIL: multi-label F1 on hand-computed cases, the annotation reader, the stages on tiny images, and the synthetic
check (LOCO-tuned pipeline beats always-present / never-present on macro F1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from halsift.eval.metrics.vigil import (ColourSegmenter, ColourShapeEncoder, VigilConfig, VigilFormatError, analyze, decide,
                                label_matrix, loco_search, multilabel_f1, read_vigil, VigilRecord)
from halsift.launch.cli import main


def test_multilabel_f1_hand_computed():
    y = np.array([[1, 0, 1], [1, 1, 0], [0, 0, 0], [0, 1, 0]])
    p = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0], [0, 1, 1]])
    m = multilabel_f1(y, p, ["a", "a", "b", "b"])
    # in %: objects: tp 1 fp 1 fn 1 -> 50; background: tp 2 -> 100; omission: tp 0 -> 0
    assert (m["f1/objects"], m["f1/background"], m["f1/object_omission"], m["f1/macro"]) == (50.0, 100.0, 0.0, 50.0)
    # category a: objects 2/3, background 1, omission 0 -> 5/9; b: objects 0, background 1, omission 0 -> 1/3
    assert m["f1/a/macro"] == pytest.approx(500 / 9)
    assert m["f1/macro_categories"] == pytest.approx((500 / 9 + 100 / 3) / 2)


def test_read_vigil_layout(tmp_path):
    data = [{"generated_photo": "cars/g1.png", "background_photo": "bg1.png", "object_photos": ["o1.png"],
             "prompt": "Place the car", "hallucination": {"objects": "the wheel changed", "background": "",
                                                          "object_omission": None}},
            {"generated_photo": "g2.png", "category": "furniture",
             "hallucination": {"objects": " ", "background": "wall", "object_omission": "sofa missing"}}]
    f = tmp_path / "ann.json"
    f.write_text(json.dumps(data))
    recs = read_vigil(f)
    assert recs[0].labels == {"objects": True, "background": False, "object_omission": False}
    assert recs[1].labels == {"objects": False, "background": True, "object_omission": True}
    assert recs[0].category == "cars" and recs[1].category == "furniture" and recs[0].references == [tmp_path / "o1.png"]
    f.write_text(json.dumps([{"generated_photo": "x.png", "hallucination": {"objects": ""}}]))
    with pytest.raises(VigilFormatError, match="record 0.*background, object_omission"):
        read_vigil(f)


def _scene(draw_obj=True, colour=(200, 30, 30), patch=False):
    img = np.full((40, 40, 3), 200, np.uint8)
    if draw_obj:
        img[10:20, 10:22] = colour
    if patch:
        img[28:38, 28:38] = (120, 120, 120)
    return img


def test_stages_on_tiny_images():
    ref = np.full((20, 20, 3), 255, np.uint8)
    ref[4:14, 3:15] = (200, 30, 30)
    bg = _scene(draw_obj=False)
    seg, enc = ColourSegmenter(min_area=10), ColourShapeEncoder()
    cases = {"clean": _scene(), "mutated": _scene(colour=(30, 60, 200)), "omitted": _scene(draw_obj=False),
             "background": _scene(patch=True)}
    flags = {}
    for name, gen in cases.items():
        rec = VigilRecord(name, "c", "Place the red box", bg, [ref], gen, {})
        a = analyze(rec, seg, enc, ["box"])
        fnd = decide(a, VigilConfig(tau=0.3, margin=0.2, boxes=True, min_box_area=20))
        flags[name] = fnd.flags
        assert len(fnd.explanations) == sum(fnd.flags.values()) or name == "background"
    assert flags["clean"] == {"objects": False, "background": False, "object_omission": False}
    assert flags["mutated"]["objects"] and not flags["mutated"]["object_omission"]
    assert flags["omitted"] == {"objects": False, "background": False, "object_omission": True}
    assert flags["background"] == {"objects": False, "background": True, "object_omission": False}


def test_synthetic_pipeline_beats_trivial_baselines():
    from halsift.synth.vigil import CATEGORIES, VOCABULARY, synthetic_vigil

    recs = synthetic_vigil(12, seed=0)
    assert {r.category for r in recs} == set(CATEGORIES) and len(recs) == 60
    seg, enc = ColourSegmenter(), ColourShapeEncoder()
    analyses = [analyze(r, seg, enc, VOCABULARY) for r in recs]
    y = label_matrix([r.labels for r in recs])
    cats = [r.category for r in recs]
    grid = [VigilConfig(tau=t, margin=m, boxes=b) for t in (0.4, 0.8) for m in (0.0, 0.2) for b in (False, True)]
    pred, splits = loco_search(analyses, y, cats, grid)
    f = multilabel_f1(y, pred, cats)
    always = multilabel_f1(y, np.ones_like(y), cats)
    never = multilabel_f1(y, np.zeros_like(y), cats)
    assert f["f1/macro"] > always["f1/macro"] + 20 and f["f1/macro"] > never["f1/macro"]
    assert f["f1/macro_categories"] > always["f1/macro_categories"]
    assert len(splits) == 5 and all(s["config"]["tau"] == 0.4 for s in splits)  # tau 0.8 loses mutated objects


def test_cli_synthetic(tmp_path):
    out = tmp_path / "vigil"
    assert main(["eval", "vigil", "--synthetic", "--per-category", "6", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["records"] == 30 and m["f1/macro"] > m["baseline/always-present/macro"]
    assert m["baseline/never-present/macro"] == 0.0
    lines = (out / "findings.jsonl").read_text().splitlines()
    assert len(lines) == 30 and "explanations" in json.loads(lines[0])
    assert "macro" in (out / "report.md").read_text()
    with Image.open(out / "plots" / "vigil_f1.png") as im:
        assert im.size[0] > 100
    assert main(["eval", "vigil", "--out", str(tmp_path / "x")]) == 2


def test_cli_annotation_files(tmp_path):
    ann = _annotation_files(tmp_path)
    out = tmp_path / "o"
    assert main(["eval", "vigil", "--annotations", str(ann), "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["f1/object_omission"] == 100.0 and m["records"] == 2 and m["prevalence/object_omission"] == 50.0


def _annotation_files(tmp_path) -> Path:
    ref = np.full((20, 20, 3), 255, np.uint8)
    ref[4:14, 3:15] = (200, 30, 30)
    Image.fromarray(ref).save(tmp_path / "ref.png")
    Image.fromarray(_scene(draw_obj=False)).save(tmp_path / "bg.png")
    ann = []
    for name, gen, lab in (("clean", _scene(), ""), ("gone", _scene(draw_obj=False), "box missing")):
        Image.fromarray(gen).save(tmp_path / f"{name}.png")
        ann.append({"generated_photo": f"{name}.png", "background_photo": "bg.png", "object_photos": ["ref.png"],
                    "prompt": "Place the red box on the shelf", "category": "toys",
                    "hallucination": {"objects": "", "background": "", "object_omission": lab}})
    (tmp_path / "ann.json").write_text(json.dumps(ann))
    return tmp_path / "ann.json"


def test_real_annotations_use_the_given_vocabulary_not_the_synthetic_worlds(tmp_path):
    """Real annotations: object names come from the user's vocabulary (or the prompt's words), never the synthetic
    world's product list; the library function is what the command runs."""
    from halsift.eval.runs.vigil import VigilEvalConfig, run_vigil

    ann = _annotation_files(tmp_path)
    res = run_vigil(VigilEvalConfig(annotations=str(ann), out=str(tmp_path / "words")))
    assert res.metrics["f1/object_omission"] == 100.0 and res.files["findings"].exists()
    gone = [json.loads(x) for x in res.files["findings"].read_text().splitlines()][1]
    assert "reference object 1 (red)" in gone["explanations"][0]  # the prompt's first content word
    (tmp_path / "vocab.json").write_text(json.dumps({"box": ["crate"], "shelf": []}))
    assert main(["eval", "vigil", "--annotations", str(ann), "--vocab", str(tmp_path / "vocab.json"),
                 "--out", str(tmp_path / "vocab")]) == 0
    gone = json.loads((tmp_path / "vocab" / "findings.jsonl").read_text().splitlines()[1])
    assert "reference object 1 (box)" in gone["explanations"][0]
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["eval", "vigil", "--annotations", str(ann), "--vocab", str(tmp_path / "bad.json"),
                 "--out", str(tmp_path / "b")]) == 2


def test_open_clip_encoder_and_bad_settings(tmp_path, capsys):
    """The encoder is a setting: an open_clip image tower (halsift-tiny, random weights here) runs the same pipeline;
    bad settings are one-line errors naming the flag."""
    ann = _annotation_files(tmp_path)
    assert main(["eval", "vigil", "--annotations", str(ann), "--encoder", "open_clip", "--clip-arch", "halsift-tiny",
                 "--out", str(tmp_path / "clip")]) == 0
    m = json.loads((tmp_path / "clip" / "metrics.json").read_text())
    assert m["records"] == 2 and 0 <= m["f1/macro"] <= 100
    capsys.readouterr()
    for flags, name in ((["--encoder", "sam"], "--encoder"), (["--encoder", "open_clip"], "--clip-arch"),
                        (["--min-area", "0"], "--min-area"), (["--synthetic"], "--synthetic")):
        assert main(["eval", "vigil", "--annotations", str(ann), *flags, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"halsift eval vigil: error: {name}"), err


def test_library_needs_the_synthetic_data_passed_in(tmp_path):
    """The library never reaches into halsift.synth: a synthetic config without data is a clear error, and the
    synthetic world's inputs give the command's numbers."""
    from halsift.corpus.config import ConfigError
    from halsift.eval.runs.vigil import VigilEvalConfig, run_vigil
    from halsift.synth.vigil import synthetic_inputs

    cfg = VigilEvalConfig(synthetic=True, per_category=3, out=str(tmp_path / "lib"))
    with pytest.raises(ConfigError, match="synthetic"):
        run_vigil(cfg)
    lib = run_vigil(cfg, synthetic_inputs(cfg))
    assert main(["eval", "vigil", "--synthetic", "--per-category", "3", "--out", str(tmp_path / "cli")]) == 0
    assert lib.metrics_file.read_text() == (tmp_path / "cli" / "metrics.json").read_text()
    assert lib.report.read_text() == (tmp_path / "cli" / "report.md").read_text()
