"""Retrieval recall vs an independent brute-force computation (Python loops over sorted lists)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from halsift.eval.metrics.retrieval import recall_at_k


def brute_force(img, txt, t2i, ks):
    """Sort every query's candidates by cosine similarity and look for a correct one in the first k."""
    def cos(a, b):
        return sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))

    out = {}
    captions_of = {i: [j for j, im in enumerate(t2i) if im == i] for i in range(len(img))}
    for k in ks:
        hits = 0
        for i in range(len(img)):
            order = sorted(range(len(txt)), key=lambda j: -cos(img[i], txt[j]))
            hits += any(j in order[:k] for j in captions_of[i])
        out[f"i2t/r@{k}"] = 100.0 * hits / len(img)
        hits = 0
        for j in range(len(txt)):
            order = sorted(range(len(img)), key=lambda i: -cos(txt[j], img[i]))
            hits += t2i[j] in order[:k]
        out[f"t2i/r@{k}"] = 100.0 * hits / len(txt)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recall_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n_img, dim = 23, 8
    caps_per_image = rng.integers(1, 6, size=n_img)  # 1..5 captions per image, like COCO/Flickr
    t2i = np.repeat(np.arange(n_img), caps_per_image)
    img = rng.normal(size=(n_img, dim))
    # captions correlated with their image so recall is neither 0 nor 100
    txt = img[t2i] + rng.normal(scale=1.5, size=(len(t2i), dim))
    perm = rng.permutation(len(t2i))  # captions need not be grouped by image
    txt, t2i = txt[perm], t2i[perm]
    ks = (1, 5, 10)
    got = recall_at_k(img, txt, t2i, ks)
    want = brute_force(img.tolist(), txt.tolist(), t2i.tolist(), ks)
    for key, val in want.items():
        assert got[key] == pytest.approx(val, abs=1e-9), key
    assert 0 < got["t2i/r@1"] < 100 and got["i2t/r@10"] >= got["i2t/r@5"] >= got["i2t/r@1"]


def test_perfect_and_constant_embeddings():
    img = np.eye(4)
    t2i = np.array([0, 0, 1, 2, 3, 3])
    perfect = recall_at_k(img, img[t2i], t2i, ks=(1,))
    assert perfect["i2t/r@1"] == 100.0 and perfect["t2i/r@1"] == 100.0
    const = recall_at_k(np.ones((4, 3)), np.ones((6, 3)), t2i, ks=(1,))
    assert const["i2t/r@1"] == 0.0 and const["t2i/r@1"] == 0.0  # ties count against the query


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="text_to_image has 2 entries"):
        recall_at_k(np.ones((3, 2)), np.ones((4, 2)), [0, 1])
    with pytest.raises(ValueError, match="image indices"):
        recall_at_k(np.ones((3, 2)), np.ones((2, 2)), [0, 3])
    with pytest.raises(ValueError, match="dim"):
        recall_at_k(np.ones((3, 2)), np.ones((2, 5)), [0, 1])


def test_one_precision_rule_for_every_retrieval_eval():
    """`eval retrieval`, training's in-loop eval and the recipe all read precision the same way (issue 30): auto is
    bf16 on a GPU only; an unknown value is refused naming the setting."""
    from halsift.eval.metrics.retrieval import use_bf16

    assert use_bf16("auto", "cpu") is False and use_bf16("auto", "cuda:1") is True
    assert use_bf16("bf16", "cpu") is True and use_bf16("fp32", "cuda") is False
    with pytest.raises(ValueError, match="precision: expected one of auto, bf16, fp32, got 'fp16'"):
        use_bf16("fp16", "cpu")
