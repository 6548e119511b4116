"""VOPE: the four sets and Eqs. 1-4 on hand-computed cases, the CHAIR_i identity, extraction with synonyms, and
the recovery of designed rates from simulated responders."""

from __future__ import annotations

import json
import math

import pytest
from PIL import Image

from halsift.eval.metrics.vope import (ObjectVocabulary, chair_i, classify, parse_yes_no, vope_metrics, vope_rates)
from halsift.launch.cli import main


def test_rates_hand_computed():
    r = vope_rates({"D_T": 6, "D_H": 2, "I_T": 3, "I_H": 1})
    assert (r["hal_d"], r["hal_i"]) == (25.0, 25.0)  # percentages: 2 of 8, 1 of 4
    assert r["exp"] == 100 * 4 / 12 and r["chair_i"] == 100 * 5 / 12
    assert math.isnan(vope_rates({"D_T": 3})["hal_i"])


def test_classify_and_extraction():
    vocab = ObjectVocabulary({"dog": ["puppy"], "circle": ["disc"], "traffic light": [], "car": []})
    text = "A puppy chases two discs past a traffic light; the dogs bark. No cars? Cartoon."
    assert vocab.extract(text) == ["dog", "circle", "traffic light", "car"]
    sets = classify(["dog", "circle", "traffic light", "car"],
                    {"dog": True, "circle": True, "traffic light": False, "car": None}, present={"dog", "traffic light"})
    assert sets == {"D_T": ["dog"], "D_H": ["circle"], "I_T": [], "I_H": ["traffic light"], "unparsed": ["car"]}
    assert parse_yes_no("Yes, there is.") is True and parse_yes_no("no") is False and parse_yes_no("maybe") is None


def test_synthetic_recovers_designed_rates_and_chair_identity():
    from halsift.synth.vope import PROFILES, TASKS, designed_rates, run_synthetic

    records, truth = run_synthetic(120, seed=0)
    m = vope_metrics(records)
    for p in PROFILES:
        assert m[f"{p.name}/all/hal_d"] == pytest.approx(100 * p.hal_d, abs=4)
        assert m[f"{p.name}/all/hal_i"] == pytest.approx(100 * p.hal_i, abs=6)
        for t in TASKS:
            d = designed_rates(p, t)
            assert m[f"{p.name}/{t}/exp"] == pytest.approx(d["exp"], abs=7)
            sub = [r for r in records if r.model == p.name and r.task == t]
            # CHAIR_i computed from the ground truth alone equals (|D_H| + |I_T|) / all (Eq. 4)
            assert chair_i(sub, truth) == pytest.approx(m[f"{p.name}/{t}/chair_i"], abs=1e-10)
    # CHAIR_i overstates hallucination where imagination is voluntary (story), Hal-D does not
    careful = PROFILES[0].name
    assert m[f"{careful}/story/chair_i"] > 3 * m[f"{careful}/story/hal_d"]
    # relevance: hallucinated shapes are always scored 3 by the synthetic judge
    assert m.get(f"{careful}/all/relevance/D_H/1", 0) == 0 and m[f"{careful}/all/relevance/I_T/1"] > 0


def test_unparsed_rechecks_are_excluded_and_counted():
    from halsift.synth.vope import PROFILES, run_synthetic

    records, _ = run_synthetic(20, seed=1, profiles=PROFILES[:1], judge=False, unparsed=0.2)
    m = vope_metrics(records)
    assert m[f"{PROFILES[0].name}/all/unparsed_rate"] == pytest.approx(20, abs=8)
    n = sum(m[f"{PROFILES[0].name}/all/n/{s}"] for s in ("D_T", "D_H", "I_T", "I_H"))
    assert n == sum(len(o) for r in records for o in r.objects.values())


def _vocab(tmp_path) -> str:
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({"dog": ["puppy"], "cat": [], "circle": ["disc"], "star": [], "tree": []}))
    return str(path)


def test_cli_synthetic_and_file(tmp_path, capsys):
    out = tmp_path / "vope"
    assert main(["eval", "vope", "--synthetic", "--images", "15", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["scale"] == 100 and 0 <= m["sloppy-vlm/story/hal_d"] <= 100 and "careful-vlm/all/chair_i" in m
    assert "Hal-D" in (out / "report.md").read_text()
    with Image.open(out / "plots" / "vope_rates.png") as im:
        assert im.size[0] > 100
    rows = [{"model": "m", "task": "story", "image_id": "i1", "response": "A dog met a cat near a circle.",
             "present": ["circle", "cat"], "presence": {"dog": "No.", "cat": "no", "circle": "Yes"},
             "relevance": {"dog": 2}},
            {"model": "m", "task": "story", "image_id": "i2", "response": "A star and a tree.",
             "present": ["tree"], "presence": {"star": "yes", "tree": "yes"}}]
    f = tmp_path / "resp.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    # real responses are read with the user's vocabulary, never the synthetic world's by default
    assert main(["eval", "vope", "--responses", str(f), "--out", str(tmp_path / "u")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("halsift eval vope: error: --vocab: ") and "'objects'" in err[0]
    vocab = _vocab(tmp_path)
    assert main(["eval", "vope", "--responses", str(f), "--vocab", vocab, "--out", str(tmp_path / "u")]) == 0
    m = json.loads((tmp_path / "u" / "metrics.json").read_text())
    # D_T = {circle, tree}, D_H = {star}, I_T = {dog}, I_H = {cat}
    assert m["m/story/hal_d"] == pytest.approx(100 / 3) and m["m/story/hal_i"] == 50.0
    assert m["m/story/exp"] == 40.0 and m["m/story/chair_i"] == 40.0
    assert m["m/story/relevance/I_T/2"] == 1 and m["parse/no_punct_replies"] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"model": "m"}\n')
    assert main(["eval", "vope", "--responses", str(bad), "--vocab", vocab, "--out", str(tmp_path / "b")]) == 2
    assert "--responses: " in capsys.readouterr().err


def test_free_form_rechecks_and_the_unparsed_default(tmp_path):
    """Real re-check replies are often sentences: clear ones are read, the rest follow --unparsed (default yes,
    like the official code) and are counted; 'No.' stays no (the official code reads it as yes)."""
    assert parse_yes_no("There is a dog lying on the sofa.") is True
    assert parse_yes_no("There is no dog in the image.") is False
    assert parse_yes_no("I don't see any dog here.") is False and parse_yes_no("No.") is False
    assert parse_yes_no("The image shows a sofa.") is None
    row = {"model": "m", "task": "story", "image_id": "i1", "response": "A dog met a cat near a circle.",
           "present": ["circle"], "presence": {"dog": "The image shows a sofa.", "cat": "There is no cat.",
                                               "circle": "There is a circle at the top."}}
    f = tmp_path / "resp.jsonl"
    f.write_text(json.dumps(row) + "\n")
    got = {}
    for mode in ("yes", "exclude"):
        assert main(["eval", "vope", "--responses", str(f), "--unparsed", mode, "--vocab", _vocab(tmp_path),
                     "--out", str(tmp_path / mode)]) == 0
        got[mode] = json.loads((tmp_path / mode / "metrics.json").read_text())
    # default yes: dog (absent, unparsed -> believed present) is D_H; circle D_T; cat I_T
    assert got["yes"]["m/story/n/D_H"] == 1 and got["yes"]["m/story/defaulted_rate"] == pytest.approx(100 / 3)
    assert got["yes"]["m/story/unparsed_rate"] == 0
    assert got["exclude"]["m/story/n/D_H"] == 0 and got["exclude"]["m/story/unparsed_rate"] == pytest.approx(100 / 3)
    assert "counted as yes (as the official code)" in (tmp_path / "yes" / "report.md").read_text()
