"""Issue 44: ``learn=EMB``, the cascade's cheap score refined on the judge's own sample. Where the answer is known
(the vectors know part of what the cheap stage misses) the refined cascade keeps fewer wrong captions at the same
budget; through the CLI the judge is still called only on the sample and the band (now placed on the refined score),
the head is the linear student the plan names, calibration units pass through it encoded on the fly, a rerun calls
nothing, and bad inputs are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from filtering_data import make_bench, make_corpus
from test_cascade import CHEAP, CountingOracle
from test_cascade import _counting_oracle  # noqa: F401 - registers countoracle for this module too

from halsift.filtering.detectors.student import features
from halsift.filtering.scoring.cascade_learn import MIN_UNITS, fit_head, refined
from halsift.filtering.scoring.cascade_plan import aggregate, caption_groups, fit_plan, unit_sample
from halsift.launch.cli import main

TINY = "clip:arch=halsift-tiny,pretrained=random,seed=0"


def test_the_refined_cascade_keeps_fewer_wrong_captions_at_the_same_budget():
    # judge = the truth q per sentence; the cheap stage sees q + noise a; the vectors carry q + an independent noise
    # b. Neither alone is good; together they are (what the quickstart's clip-lora and base-CLIP vectors are to the
    # judge). The selection keeps the top 20 % of captions by mean.
    rng = np.random.default_rng(3)
    n_cap = 6000
    per = rng.integers(1, 5, n_cap)
    keys = [f"c{c}" for c in range(n_cap) for _ in range(per[c])]
    idx = np.concatenate([np.arange(k) for k in per])
    n = len(keys)
    q = rng.uniform(0, 100, n)
    cheap = q + rng.normal(0, 35, n)
    dim = 8
    img = rng.normal(size=(n, dim))
    txt = rng.normal(size=(n, dim))
    txt[:, 0] = (q + rng.normal(0, 35, n)) / 50.0  # the vectors' view of q
    feats = features(img, txt).astype(np.float64)
    groups, ng = caption_groups(keys)
    budget, rate = 0.25, 0.3 * 0.25
    sampled = unit_sample(keys, idx, 0, rate, "mean")
    w, bias, coef, oof, _ = fit_head(feats[sampled], cheap[sampled], q[sampled], groups[sampled])
    head = feats @ w + bias + coef * cheap
    assert np.isfinite(oof).all() and np.isfinite(w).all()
    fit_on = head.copy()
    fit_on[sampled] = oof

    def final(score, fit):
        plan = fit_plan("s", fit, sampled, q[sampled], budget, 0.2, rate, 0, keys=keys, agg="mean")
        s, band = plan.judged(keys, idx, score)
        assert (s | band).sum() <= budget * n + 1  # the same judge calls
        return np.where(s | band, q, plan.standing(keys, score))

    truth = aggregate(q, groups, ng, "mean")
    top = truth >= np.quantile(truth, 0.8)
    wrong = lambda s: (((a := aggregate(s, groups, ng, "mean")) >= np.quantile(a, 0.8)) != top).sum()  # noqa: E731
    plain, learned = wrong(final(cheap, cheap)), wrong(final(head, fit_on))
    assert learned < 0.8 * plain, (plain, learned)
    # the head leans on both inputs: the cheap score and the vectors' coordinate that carries q
    assert coef > 0 and w[dim] > 0


def test_a_head_needs_a_sample_of_some_size():
    rng = np.random.default_rng(0)
    with pytest.raises(Exception, match=f"at least {MIN_UNITS}.*learn="):
        fit_head(rng.normal(size=(10, 5)), rng.normal(size=10), rng.normal(size=10), np.arange(10))


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("learn")
    corpus = make_corpus(root / "corpus", shards=3, per_shard=40, seed=5)
    assert main(["embed", "--model", TINY, "--data", str(corpus), "--out", str(root / "emb"), "--no-progress"]) == 0
    spec = f"cascade:cheap=[{CHEAP}],judge=[countoracle],budget=0.5,sample=0.5,agg=mean,learn={root / 'emb'}"
    CountingOracle.calls.clear()
    assert main(["score", "--detector", spec, "--data", str(corpus), "--out", str(root / "cas"), "--no-progress",
                 "--batch-size", "16"]) == 0
    return corpus, root, spec, list(CountingOracle.calls)


def _table(folder):
    from halsift.corpus.scores import read_scores

    cols = ["key", "sentence_index", "score"] + (["scored_by"] if (folder / "_cascade").is_dir() else [])
    return read_scores(folder, cols).to_pandas()


def _refined(folder, plan):
    cheap, head = _table(folder / "_stages" / "cheap"), _table(folder / "_stages" / "learned")
    assert cheap["key"].tolist() == head["key"].tolist()
    return cheap, refined(head["score"].to_numpy(), cheap["score"].to_numpy(), plan.learned)


def test_the_judge_is_called_on_the_sample_and_the_band_of_the_refined_score(learned_run):
    from halsift.filtering.scoring.cascade import load_plan

    _, root, _, calls = learned_run
    out = root / "cas"
    plan = load_plan(out)
    cheap, ref = _refined(out, plan)
    keys, idx = cheap["key"].tolist(), cheap["sentence_index"].to_numpy()
    sampled, band = plan.judged(keys, idx, ref)
    want = {u for u, j in zip(zip(keys, idx), sampled | band) if j}
    assert set(calls) == want and len(calls) == len(want) <= 0.5 * len(keys) + 1
    m = json.loads((out / "_manifest.json").read_text())["cascade"]
    assert m["learned"]["sample_units"] == int(sampled.sum()) >= MIN_UNITS
    assert m["learned"]["embeddings_model"].startswith("clip:arch=halsift-tiny")
    # units the judge did not see stand at the plan's place for their refined score, not their cheap one
    t = _table(out)
    rest = (t["scored_by"] == "cheap").to_numpy()
    assert rest.any()
    assert np.allclose(t["score"].to_numpy()[rest], plan.standing(keys, ref)[rest], atol=1e-4)


def test_the_head_is_a_linear_student_on_the_stored_vectors(learned_run):
    from halsift.corpus.embedding_store import IMAGE, read_embeddings
    from halsift.corpus.weights import read_safetensors
    from halsift.filtering.scoring.cascade import load_plan

    _, root, _, _ = learned_run
    plan = load_plan(root / "cas")
    folder = root / "cas" / "_cascade" / plan.learned["student"]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["output"] == "linear" and cfg["hidden"] == 0
    state = read_safetensors(folder / "model.safetensors", "head")
    head = _table(root / "cas" / "_stages" / "learned")
    img = read_embeddings(root / "emb", IMAGE)
    txt = read_embeddings(root / "emb", 0)
    by_img = dict(zip(img.keys, img.vectors))
    by_txt = {(k, int(i)): v for k, i, v in zip(txt.keys, txt.sentence_index, txt.vectors)}
    x = features(np.stack([by_img[k] for k in head["key"]]),
                 np.stack([by_txt[(k, int(i))] for k, i in zip(head["key"], head["sentence_index"])]))
    want = x @ state["weight"].numpy()[0] + state["bias"].numpy()[0]
    assert np.allclose(head["score"].to_numpy(), want, atol=1e-3)


def test_calibration_units_are_encoded_and_pass_through_the_frozen_head(learned_run, tmp_path):
    from halsift.filtering.scoring.cascade import caption_labels, load_plan

    _, root, spec, _ = learned_run
    out = root / "cas"
    student = (out / "_cascade" / "student" / "model.safetensors").read_bytes()
    bench = make_bench(tmp_path / "bench", captions=60, seed=6)
    CountingOracle.calls.clear()
    assert main(["score", "--detector", f"{spec},plan={out}", "--data", str(bench), "--out", str(tmp_path / "cal"),
                 "--no-progress"]) == 0
    assert (out / "_cascade" / "student" / "model.safetensors").read_bytes() == student  # nothing refitted
    plan = load_plan(out)
    cheap, ref = _refined(tmp_path / "cal", plan)
    keys = caption_labels(str(bench), cheap["key"].tolist(), "mean")
    sampled, band = plan.judged(keys, cheap["sentence_index"].to_numpy(), ref)
    want = {u for u, j in zip(zip(cheap["key"], cheap["sentence_index"]), sampled | band) if j}
    assert set(CountingOracle.calls) == want
    m = json.loads((tmp_path / "cal" / "_manifest.json").read_text())
    assert m["cascade"]["frozen_from"] == str(out) and m["cascade"]["learned"] == plan.learned
    # the bench's rows are in no embeddings folder: the head encoded them with the CLIP that made the corpus's
    assert "embeddings=" not in json.loads((tmp_path / "cal" / "_stages" / "learned" / "_manifest.json")
                                           .read_text())["detector"]


def test_a_rerun_calls_nothing_and_refits_nothing(learned_run):
    corpus, root, spec, _ = learned_run
    plan = (root / "cas" / "_cascade" / "plan.json").read_text()
    CountingOracle.calls.clear()
    assert main(["score", "--detector", spec, "--data", str(corpus), "--out", str(root / "cas"), "--no-progress"]) \
        == 0
    assert CountingOracle.calls == [] and (root / "cas" / "_cascade" / "plan.json").read_text() == plan


def test_vectors_of_another_corpus_are_one_line(learned_run, tmp_path, capsys):
    _, root, _, _ = learned_run
    other = make_corpus(tmp_path / "other", shards=2, per_shard=40, seed=8)
    spec = f"cascade:cheap=[{CHEAP}],judge=[countoracle],budget=0.5,sample=0.5,agg=mean,learn={root / 'emb'}"
    assert main(["score", "--detector", spec, "--data", str(other), "--out", str(tmp_path / "cas"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # refused before the cheap pass: the shards' content differs
    assert len(err) == 1 and str(root / "emb") in err[0] and "rerun `halsift embed`" in err[0], err
    assert not (tmp_path / "cas" / "_stages").exists()


def test_a_sample_too_small_to_teach_is_one_line(tmp_path, capsys):
    corpus = make_corpus(tmp_path / "corpus", shards=1, per_shard=20, seed=2)
    assert main(["embed", "--model", TINY, "--data", str(corpus), "--out", str(tmp_path / "emb"),
                 "--no-progress"]) == 0
    spec = f"cascade:cheap=[{CHEAP}],judge=[countoracle],budget=0.2,agg=mean,learn={tmp_path / 'emb'}"
    assert main(["score", "--detector", spec, "--data", str(corpus), "--out", str(tmp_path / "cas"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"at least {MIN_UNITS} needed" in err and "drop learn=" in err
