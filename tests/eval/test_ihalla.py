"""I-HallA: Eq. 1 and the strict variant on hand-computed cases, the official-layout loader, the VLM adapter,
and the synthetic check (the scene oracle ranks generators by their true error rate)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from PIL import Image

from halsift.eval.metrics.ihalla import (ChoiceVlmAnswerer, PromptQA, QAFormatError, QAItem, answer_all, correlations,
                                 ihalla_metrics, ihalla_scores, load_predictions, load_qa, parse_letter)
from halsift.launch.cli import main

CH = ("one", "two", "three", "four", "None of the above")


def _answers(rows):
    return pd.DataFrame([{"generator": g, "prompt_id": p, "category": c, "qid": i, "coi": coi, "gold": "A",
                          "pred": "A" if ok else "B", "parsed": True, "correct": ok}
                         for g, p, c, i, coi, ok in rows])


def test_score_and_strict_hand_computed():
    # gen x: prompt 1 answers 2/5 right, prompt 2 5/5 -> I-HallA (0.4 + 1.0) / 2 = 0.7, strict 1/2
    rows = [("x", "p1", "sci", i, "color" if i < 2 else "counting", i < 2) for i in range(5)]
    rows += [("x", "p2", "his", i, "counting", True) for i in range(5)]
    # gen y: prompt 1 has 4 questions, 1 right (0.25); prompt 2 has 5, 4 right (0.8) -> 0.525, strict 0
    rows += [("y", "p1", "sci", i, "color", i == 0) for i in range(4)]
    rows += [("y", "p2", "his", i, "counting", i != 3) for i in range(5)]
    sc = ihalla_scores(_answers(rows))
    assert sc.loc["x", "ihalla"] == pytest.approx(0.7) and sc.loc["x", "strict"] == pytest.approx(0.5)
    assert sc.loc["y", "ihalla"] == pytest.approx(0.525) and sc.loc["y", "strict"] == 0.0
    m = ihalla_metrics(_answers(rows))
    assert m["ihalla/x/coi/color"] == 1.0 and m["ihalla/x/coi/counting"] == pytest.approx(5 / 8)
    assert m["ihalla/y/category/sci"] == pytest.approx(0.25) and m["ihalla/mean"] == pytest.approx(0.6125)


def test_correlations_match_known_values():
    c = correlations([1, 2, 3, 4], [1, 3, 2, 4])
    assert c["spearman"] == pytest.approx(0.8) and c["kendall"] == pytest.approx(4 / 6)
    assert c["pearson"] == pytest.approx(0.8)
    assert math.isnan(correlations([1, 1], [2, 3])["pearson"])


def test_parse_letter_and_vlm_adapter():
    assert parse_letter("B) Tetrahedral") == "B" and parse_letter("The answer is (C).") == "C"
    assert parse_letter("four", CH) == "D" and parse_letter("I cannot tell", CH) is None
    replies = iter(["A", "no idea", "Answer: E"])
    ans = ChoiceVlmAnswerer(generate=lambda img, prompt: next(replies))
    out = [ans.answer(None, "How many?", CH) for _ in range(3)]
    assert out == [("A", True), (None, False), ("E", True)] and ans.failures == 1 and ans.asked == 3
    logits = ChoiceVlmAnswerer(score_letters=lambda img, prompt, letters: [0, 3, 1, 0, 0])
    assert logits.answer(None, "How many?", CH) == ("B", True)


def test_parse_matches_official_reader_on_real_replies():
    """Replies as GPT-4o and open VLMs write them; the official code reads the 'Answer:' line's first character."""
    from halsift.eval.metrics.ihalla import official_letter

    same = {"b": "B", "B": "B", "c)": "C", "d. a cat": "D", "Answer: e": "E", "Sure.\nAnswer: A\nBecause...": "A",
            "E) None of the above": "E", "A": "A"}
    for reply, letter in same.items():
        assert parse_letter(reply, CH) == letter == official_letter(reply), reply
    # where the official reader errs, ours reads the intended letter (counted by load_predictions)
    assert official_letter("The answer is (C).") is None and parse_letter("The answer is (C).") == "C"
    assert official_letter("Based on the image, none.") == "B" and parse_letter("Based on the image, none.") is None
    assert official_letter("(d) a cat") is None and parse_letter("(d) a cat") == "D"
    assert official_letter("four") is None and parse_letter("four", CH) == "D"


def test_load_official_layout_and_predictions(tmp_path):
    qa = tmp_path / "qa.csv"
    pd.DataFrame({"Index": ["1", "1", "2"], "CoI": ["Counting", "Color", "Existence"],
                  "Question": ["How many atoms?", "What colour?", "What is at the center?"],
                  "Choices": ["A) Two B) Three C) Four D) Five E) None of the above",
                              "A) Red B) Blue C) Green D) Black E) None of the above",
                              "A) Carbon B) Hydrogen C) Oxygen D) Nitrogen E) None of the above"],
                  "Answer": ["C", "B) Blue", "Carbon"]}).to_csv(qa, index=False)
    sets = load_qa(qa)
    assert [q.prompt_id for q in sets] == ["1", "2"]
    assert sets[0].items[0].answer == "C" and sets[0].items[1].answer == "B" and sets[1].items[0].answer == "A"
    assert sets[0].items[1].coi == "color" and sets[0].items[0].choices[-1] == "None of the above"
    preds = tmp_path / "pred.csv"
    pd.DataFrame({"generator": ["g"] * 3, "index": ["1", "1", "2"], "question_no": [1, 2, 1],
                  "prediction": ["C) Four", "garbled", "a"]}).to_csv(preds, index=False)
    ans = load_predictions(preds, sets)
    m = ihalla_metrics(ans)
    assert m["ihalla/g"] == pytest.approx((0.5 + 1.0) / 2) and m["failure_rate"] == pytest.approx(100 / 3)
    assert m["parse/differs_from_official"] == 0 and m["parse/official_correct_rate"] == pytest.approx(200 / 3)
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"Index": ["1"], "CoI": ["Mood"], "Question": ["?"], "Choices": ["A) a B) b C) c D) d"],
                  "Answer": ["A"]}).to_csv(bad, index=False)
    with pytest.raises(QAFormatError, match="row 2.*CoI 'mood'"):
        load_qa(bad)


def test_qaitem_validation():
    with pytest.raises(QAFormatError, match="choice E"):
        QAItem("p", 0, "q", ("a", "b", "c", "d", "e"), "A", "color")


def test_oracle_ranks_generators_by_true_error():
    from halsift.synth.ihalla import SceneOracle, synthetic_ihalla

    data = synthetic_ihalla(60, seed=1)
    assert len(data.images) == 5 and all(len(q.items) == 5 for q in data.qa_sets)
    answers = answer_all(data.qa_sets, data.images, SceneOracle())
    sc = ihalla_scores(answers)
    rho = correlations(sc["ihalla"], [-data.true_error[g] for g in sc.index])["spearman"]
    assert rho >= 0.9, (sc, data.true_error)
    m = ihalla_metrics(answers, data.reference)
    assert m["correlation/spearman"] > 0.5 and m["failure_rate"] == 0.0


def test_oracle_perfect_on_intended_scene():
    import random

    from halsift.synth.t2i import make_prompt, sample_prompt_scene
    from halsift.synth.ihalla import SceneOracle, SynthImage, make_qa

    rng = random.Random(3)
    scene = sample_prompt_scene(rng)
    qa = make_qa("p", " ".join(s.text for s in make_prompt(scene, rng)), scene, rng)
    ans = answer_all([qa], {"exact": {"p": SynthImage("p", scene)}}, SceneOracle())
    assert ans["correct"].all() and len(ans) == 5
    empty = scene.copy()
    empty.groups, empty.sign = [], None
    ans2 = answer_all([qa], {"blank": {"p": SynthImage("p", empty)}}, SceneOracle())
    assert (ans2["pred"][ans2["coi"] != "scene"] == "E").all()


def test_cli_synthetic_and_files(tmp_path):
    out = tmp_path / "ih"
    assert main(["eval", "ihalla", "--synthetic", "--prompts", "12", "--out", str(out)]) == 0
    import json

    m = json.loads((out / "metrics.json").read_text())
    assert 0 <= m["ihalla/sd-sim"] <= 1 and "ihalla_strict/flux-sim" in m and "correlation/kendall" in m
    assert "I-HallA†" in (out / "report.md").read_text()
    for png in ("ihalla_scores.png", "ihalla_coi.png"):
        with Image.open(out / "plots" / png) as im:
            assert im.size[0] > 100
    assert main(["eval", "ihalla", "--out", str(tmp_path / "x")]) == 2
    assert main(["eval", "ihalla", "--qa", str(tmp_path / "missing.csv"), "--predictions", "p.csv",
                 "--out", str(tmp_path / "x")]) == 2


def test_cli_flags_come_from_the_config_class(tmp_path, capsys):
    """`halsift eval ihalla` takes IhallaEvalConfig's settings as flags or from --config YAML (flags win), and
    reports a bad one in one line naming the flag."""
    import json

    (tmp_path / "ih.yaml").write_text("synthetic: true\nprompts: 3\nseed: 5\n")
    assert main(["eval", "ihalla", "--config", str(tmp_path / "ih.yaml"), "--prompts", "4",
                 "--out", str(tmp_path / "a")]) == 0
    assert main(["eval", "ihalla", "--synthetic", "--prompts", "4", "--seed", "5", "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "metrics.json").read_text() == (tmp_path / "b" / "metrics.json").read_text()
    assert "seed 5, 4 prompts" in (tmp_path / "a" / "report.md").read_text()
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["ihalla/sd-sim"] >= 0
    capsys.readouterr()
    for argv, flag in ((["--synthetic", "--answer-mode", "guess"], "--answer-mode"),
                       (["--synthetic", "--prompts", "0"], "--prompts"),
                       (["--qa", "q.csv", "--answerer", "vlm:model=x"], "--answerer")):
        assert main(["eval", "ihalla", *argv, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"halsift eval ihalla: error: {flag}"), err
