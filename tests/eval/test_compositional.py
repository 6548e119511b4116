"""`halsift eval compositional`: SugarCrepe's scoring rule, its format, one-line errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from halsift.eval.metrics.compositional import compositional_metrics, cosine_scores, pair_correct, sugarcrepe_result
from halsift.launch.cli import main


def test_scoring_rule_on_a_handmade_case():
    """SugarCrepe counts a pair right only when sim(image, caption) > sim(image, negative): a tie is wrong."""
    img = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [3.0, 0.0]])
    pos = np.array([[2.0, 0.1], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    neg = np.array([[0.0, 1.0], [0.0, 5.0], [0.0, 7.0], [1.0, -1.0]])
    # pair 0: cos .998 > 0 (right); 1: 0 < 1 (wrong); 2: .707 = .707 (tie: wrong); 3: .707 = .707 (tie: wrong)
    right = pair_correct(cosine_scores(img, pos), cosine_scores(img, neg))
    assert right.tolist() == [True, False, False, False]
    m = compositional_metrics({"swap_att": right, "add_obj": np.array([True, True, False])})
    assert m == pytest.approx({"compositional/swap_att": 25.0, "compositional/add_obj": 200 / 3,
                               "compositional/mean": (25.0 + 200 / 3) / 2})
    assert sugarcrepe_result(m) == pytest.approx({"swap_att": 0.25, "add_obj": 2 / 3})


def sugarcrepe_fixture(root, missing: bool = False):
    """Two categories over three 32x32 images, SugarCrepe's layout: CATEGORY.json + images/."""
    from PIL import Image

    (root / "images").mkdir(parents=True)
    for i, colour in enumerate(("red", "blue", "green")):
        Image.new("RGB", (32, 32), colour).save(root / "images" / f"{i}.png")
    pairs = {"replace_att": {"0": {"filename": "0.png", "caption": "a red square",
                                   "negative_caption": "a blue square"},
                             "1": {"filename": "1.png", "caption": "a blue square",
                                   "negative_caption": "a red square"}},
             "add_obj": {"7": {"filename": "9.png" if missing else "2.png", "caption": "a green square",
                               "negative_caption": "a green square and a star"}}}
    for cat, d in pairs.items():
        (root / f"{cat}.json").write_text(json.dumps(d))
    return root


def _reference(root, pairs: dict) -> dict[str, float]:
    """SugarCrepe's accuracy per category (%) computed here from the model alone: each pair's image and two
    captions encoded one at a time with open_clip's own calls, right when cos(image, caption) > cos(image,
    negative)."""
    import torch
    from PIL import Image

    from halsift.filtering.models.clip_models import load_clip

    model, preprocess, tokenizer = load_clip("halsift-tiny", "random")
    model.eval()
    out = {}
    with torch.no_grad():
        for cat, items in pairs.items():
            right = 0
            for it in items.values():
                img = model.encode_image(preprocess(Image.open(root / "images" / it["filename"]).convert("RGB"))[None])
                txt = model.encode_text(tokenizer([it["caption"], it["negative_caption"]]))
                img, txt = img / img.norm(dim=-1, keepdim=True), txt / txt.norm(dim=-1, keepdim=True)
                pos, neg = (txt @ img[0]).tolist()
                assert abs(pos - neg) > 1e-5, "a near tie: the reference cannot decide this pair"
                right += pos > neg
            out[cat] = 100.0 * right / len(items)
    return out


def test_cli_writes_metrics_and_sugarcrepe_json(tmp_path, capsys):
    """The command's accuracies equal a reference computed independently from the same model, on pairs whose
    accuracy is not symmetric (a swapped caption/negative would change it)."""
    from PIL import Image

    root = tmp_path / "sc"
    (root / "images").mkdir(parents=True)
    colours = ["red", "blue", "green", "yellow", "white", "black"]
    for c in colours:
        Image.new("RGB", (32, 32), c).save(root / "images" / f"{c}.png")
    pairs = {"replace_att": {str(i): {"filename": f"{c}.png", "caption": f"a {c} square",
                                      "negative_caption": f"a {colours[(i + 1) % 6]} square"}
                             for i, c in enumerate(colours)},
             "add_obj": {str(i): {"filename": f"{c}.png", "caption": f"a {c} square",
                                  "negative_caption": f"a {c} square and a {colours[(i + 2) % 6]} star"}
                         for i, c in enumerate(colours[:5])}}
    for cat, d in pairs.items():
        (root / f"{cat}.json").write_text(json.dumps(d))
    want = _reference(root, pairs)
    assert any(v != 50.0 for v in want.values()), "swapping caption and negative would go unnoticed"
    assert main(["eval", "compositional", "--model", "halsift-tiny", "--pretrained", "random", "--device", "cpu",
                 "--data", str(root), "--images", str(root / "images"), "--out", str(tmp_path / "o")]) == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m == pytest.approx({"compositional/replace_att": want["replace_att"],
                               "compositional/add_obj": want["add_obj"],
                               "compositional/mean": (want["replace_att"] + want["add_obj"]) / 2,
                               "compositional/pairs": 11})
    sc = json.loads((tmp_path / "o" / "sugarcrepe.json").read_text())
    assert sc == pytest.approx({k: v / 100 for k, v in want.items()})


@pytest.mark.parametrize("case, message", [
    ("missing image", r"add_obj\.json: id '7': image .*9\.png is missing"),
    ("no field", r"replace_att\.json: id '0': field 'negative_caption' missing"),
    ("not json", r"replace_att\.json: not a JSON file"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, capsys, case, message):
    root = sugarcrepe_fixture(tmp_path / "sc", missing=case == "missing image")
    if case == "no field":
        (root / "replace_att.json").write_text(json.dumps({"0": {"filename": "0.png", "caption": "a"}}))
    if case == "not json":
        (root / "replace_att.json").write_text("{")
    code = main(["eval", "compositional", "--model", "halsift-tiny", "--pretrained", "random", "--device", "cpu",
                 "--data", str(root),
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and re.search(message, err), err
