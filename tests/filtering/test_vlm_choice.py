"""Multiple-choice VQA with the vlm detector (I-HallA answerer): letter log-probabilities equal an independent
forward pass, answers are letters A-E, generate mode counts unparsable replies, and the CLI runs end to end."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from halsift.eval.metrics.ihalla import LETTERS, answer_all, mc_prompt, parse_letter, vlm_answerer
from halsift.synth.ihalla import synthetic_ihalla
from halsift.filtering.detectors.spec import load_detector
from halsift.synth.tiny_vlm import build_tiny_vlm
from halsift.launch.cli import main

CHOICES = ("one", "two", "three", "four", "None of the above")


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory):
    return build_tiny_vlm("qwen2-vl", tmp_path_factory.mktemp("vlm") / "qwen", init_std=0.5)


@pytest.fixture(scope="module")
def det(vlm_path):
    return load_detector(f"vlm:model={vlm_path},device=cpu,max_new_tokens=4")


@pytest.fixture(scope="module")
def data():
    full = synthetic_ihalla(1, seed=0)
    full.images = {g: full.images[g] for g in list(full.images)[:2]}  # two generators keep the test fast
    return full


def test_letter_logprobs_match_independent_forward(vlm_path, det):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    image = Image.new("RGB", (48, 48), (200, 30, 30))
    got = det.judge.choice_logprobs(image, "What colour is the square?", CHOICES)
    assert list(got) == list(LETTERS)

    proc = AutoProcessor.from_pretrained(vlm_path)
    model = AutoModelForImageTextToText.from_pretrained(vlm_path, dtype=torch.float32).eval()
    msgs = [{"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": mc_prompt("What colour is the square?", CHOICES)}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    feats = proc(text=[text], images=[image], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logp = model(**feats).logits[0, -1].log_softmax(-1)
    vocab = [proc.tokenizer.decode([i]) for i in range(len(proc.tokenizer))]
    for letter in LETTERS:
        ids = [i for i, t in enumerate(vocab) if t in (letter, " " + letter)]
        assert ids, letter
        assert got[letter] == pytest.approx(float(torch.logsumexp(logp[ids], 0)), abs=1e-4)
        assert got[letter] < 0
    assert max(got, key=got.get) == LETTERS[int(torch.stack([torch.logsumexp(logp[[
        i for i, t in enumerate(vocab) if t.strip() == l]], 0) for l in LETTERS]).argmax())]


def test_logits_answerer_answers_letters(det, data):
    ans = vlm_answerer(det, "logits")
    answers = answer_all(data.qa_sets, data.images, ans)
    n = sum(len(q.items) for q in data.qa_sets) * len(data.images)
    assert len(answers) == n and ans.asked == n and ans.failures == 0
    assert answers["pred"].isin(list(LETTERS)).all() and answers["parsed"].all()
    # the first answer is the argmax of the letter log-probs of that question and rendered image
    qa, gen = data.qa_sets[0], next(iter(data.images))
    it = qa.items[0]
    lp = det.judge.choice_logprobs(data.images[gen][qa.prompt_id].image, it.question, it.choices)
    row = answers[(answers.generator == gen) & (answers.prompt_id == qa.prompt_id) & (answers.qid == 0)].iloc[0]
    assert row["pred"] == max(lp, key=lp.get)


def test_generate_mode_counts_failures(vlm_path, det, data):
    ans = vlm_answerer(det, "generate")
    replies = []
    orig = det.judge.generate_text

    def recording(image, prompt, max_new_tokens=None):
        replies.append(orig(image, prompt, max_new_tokens))
        return replies[-1]

    det.judge.generate_text = recording
    try:
        qa = data.qa_sets[:1]
        answers = answer_all(qa, data.images, ans)
    finally:
        del det.judge.generate_text
    expect = [parse_letter(r, it.choices) for r, it in zip(replies, [i for _ in data.images for i in qa[0].items])]
    assert len(replies) == len(answers) == ans.asked
    assert ans.failures == sum(e is None for e in expect) == int((~answers["parsed"]).sum())
    assert answers["pred"].where(answers["pred"].notna(), None).tolist() == expect
    # generate_text is greedy decoding of the same chat turn
    image = data.images[next(iter(data.images))][qa[0].prompt_id].image
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(vlm_path)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}]
    feats = proc(text=[proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)], images=[image],
                 return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = det.model.generate(**feats, max_new_tokens=4, do_sample=False)
    assert det.judge.generate_text(image, "Describe.") == proc.tokenizer.decode(out[0, feats["input_ids"].shape[1]:],
                                                                          skip_special_tokens=True)


def test_cli_synthetic_with_vlm_answerer(vlm_path, tmp_path):
    out = tmp_path / "ih"
    rc = main(["eval", "ihalla", "--synthetic", "--prompts", "1", "--answerer", f"vlm:model={vlm_path},device=cpu",
               "--out", str(out)])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    assert "ihalla/mean" in m and m["failure_rate"] == 0.0
    assert "VLM answerer" in (out / "report.md").read_text()
    assert main(["eval", "ihalla", "--synthetic", "--prompts", "2", "--answerer", "random:seed=0",
                 "--out", str(tmp_path / "bad")]) == 2
    assert main(["eval", "ihalla", "--qa", "x.csv", "--predictions", "y.csv", "--answerer", f"vlm:model={vlm_path}",
                 "--out", str(tmp_path / "bad2")]) == 2
