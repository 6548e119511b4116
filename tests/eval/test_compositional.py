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


def test_cli_writes_metrics_and_sugarcrepe_json(tmp_path, capsys):
    root = sugarcrepe_fixture(tmp_path / "sc")
    assert main(["eval", "compositional", "--model", "halsift-tiny", "--pretrained", "random", "--device", "cpu",
                 "--data", str(root),
                 "--images", str(root / "images"), "--out", str(tmp_path / "o")]) == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert set(m) == {"compositional/replace_att", "compositional/add_obj", "compositional/mean",
                      "compositional/pairs"} and m["compositional/pairs"] == 3
    assert m["compositional/replace_att"] in (0.0, 50.0, 100.0) and m["compositional/add_obj"] in (0.0, 100.0)
    assert m["compositional/mean"] == pytest.approx((m["compositional/replace_att"] + m["compositional/add_obj"]) / 2)
    sc = json.loads((tmp_path / "o" / "sugarcrepe.json").read_text())
    assert sc == pytest.approx({"replace_att": m["compositional/replace_att"] / 100,
                                "add_obj": m["compositional/add_obj"] / 100})


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
