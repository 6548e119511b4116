"""The detector protocol's explicit capabilities (set-level, localization, vlm-judge), the VLM judge a ``lora:``
adapter lends (I-HallA answers and likelihoods from the tuned model), one image encode per image on a bench, and
the VLM detectors' CPU half in ``score --decode-workers`` worker processes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from filtering_data import make_bench, make_corpus
from PIL import Image

from halsift.filtering.detectors.base import LOCALIZATION, SET_LEVEL, VLM_JUDGE, Item, MissingCapability
from halsift.filtering.detectors.spec import load_detector
from halsift.filtering.scoring.job import ScoreJob
from halsift.launch.cli import main

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory) -> Path:
    from halsift.synth.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm("qwen2-vl", tmp_path_factory.mktemp("cap_vlm") / "qwen", seed=0, init_std=0.5)


@pytest.fixture(scope="module")
def vlm_adapter(vlm_path, tmp_path_factory) -> Path:
    """A ``lora:`` adapter folder on the tiny VLM whose LoRA weights are random (not the zero-init no-op)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    folder = tmp_path_factory.mktemp("cap_adapter") / "adapter"
    model = AutoModelForImageTextToText.from_pretrained(str(vlm_path), dtype=torch.float32)
    torch.manual_seed(0)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    peft.save_pretrained(str(folder))
    (folder / "detector.yaml").write_text(yaml.safe_dump(
        {"format": "halsift-lora-detector/1", "kind": "vlm", "adapter": True, "mode": "yes_prob",
         "base": f"vlm:model={vlm_path},mode=yes_prob,dtype=float32,device=cpu"}))
    return folder


def _items() -> list[Item]:
    caps = [["a red dog sits on grass.", "it is small."], ["two birds fly.", "a sign reads stop.", "one man."]]
    out = []
    for c, cap in enumerate(caps):
        img = Image.new("RGB", (56 + 14 * c, 56), (200 - 90 * c, 40, 90))
        out += [Item(f"row{c}-{i}", i, s, cap[:i], img, f"im{c}") for i, s in enumerate(cap)]
    return out


def test_capabilities_are_declared_and_a_missing_one_names_detector_and_capability():
    rand = load_detector("random:seed=0")
    assert rand.capabilities() == frozenset()
    assert load_detector("ensemble:members=[random:seed=1,random:seed=2],norm=rank").capabilities() == {SET_LEVEL}
    assert load_detector("ensemble:members=[random:seed=1,random:seed=2]").capabilities() == frozenset()
    with pytest.raises(MissingCapability, match=r"^the I-HallA VLM answerer needs the vlm-judge capability .*; "
                                                r"detector 'random:seed=0' \(random\) does not have it$") as e:
        rand.vlm_judge("the I-HallA VLM answerer")
    msg = str(e.value)
    assert "\n" not in msg and "'random:seed=0'" in msg and VLM_JUDGE in msg and "I-HallA" in msg
    with pytest.raises(MissingCapability, match=LOCALIZATION):
        rand.require(LOCALIZATION)
    with pytest.raises(ValueError, match="capability 'nope'"):
        rand.require("nope")


def test_cli_exits_2_with_one_line_when_the_detector_has_no_judge(tmp_path, capsys):
    bench = make_bench(tmp_path / "bench", captions=3)
    assert main(["eval", "bench", "--bench", str(bench), "--detector", "random:seed=0", "--likelihood",
                 "random:seed=1", "--n-boot", "10", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--likelihood" in err[0] and "'random:seed=1'" in err[0] and VLM_JUDGE in err[0]
    assert main(["eval", "ihalla", "--synthetic", "--prompts", "1", "--answerer", "oracle",
                 "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'oracle'" in err[0] and VLM_JUDGE in err[0]


def test_vlm_capabilities(vlm_path):
    det = load_detector(f"vlm:model={vlm_path},mode=localize,device=cpu")
    assert det.capabilities() == {LOCALIZATION, VLM_JUDGE} and det.vlm_judge() is det.judge


def _merged_judge(vlm_path, adapter):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from halsift.filtering.detectors.vlm_judge import VlmJudge

    model = AutoModelForImageTextToText.from_pretrained(str(vlm_path), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return VlmJudge(merged, AutoProcessor.from_pretrained(str(vlm_path)))


def test_lora_vlm_lends_its_tuned_judge_for_likelihood_and_ihalla(vlm_path, vlm_adapter, tmp_path):
    from halsift.eval.metrics.ihalla import answer_all, vlm_answerer
    from halsift.filtering.detectors.vlm_likelihood import sentence_logliks
    from halsift.synth.ihalla import synthetic_ihalla

    lora = load_detector(f"lora:{vlm_adapter}")
    base = load_detector(f"vlm:model={vlm_path},mode=yes_prob,dtype=float32,device=cpu")
    assert VLM_JUDGE in lora.capabilities() and lora.vlm_judge() is lora.inner.judge
    items = _items()
    tuned = sentence_logliks(lora, items)
    np.testing.assert_allclose(tuned, sentence_logliks(_merged_judge(vlm_path, vlm_adapter), items), atol=1e-4)
    assert not np.allclose(tuned, sentence_logliks(base, items), atol=1e-3)  # the adapter is really in use

    data = synthetic_ihalla(1, seed=0)
    gen = next(iter(data.images))
    data.images = {gen: data.images[gen]}
    answers = answer_all(data.qa_sets[:1], data.images, vlm_answerer(lora, "logits"))
    qa = data.qa_sets[0]
    image = data.images[gen][qa.prompt_id].image
    lp = lora.judge.choice_logprobs(image, qa.items[0].question, qa.items[0].choices)
    assert answers.iloc[0]["pred"] == max(lp, key=lp.get)
    assert lp != base.judge.choice_logprobs(image, qa.items[0].question, qa.items[0].choices)
    assert main(["eval", "ihalla", "--synthetic", "--prompts", "1", "--answerer", f"lora:{vlm_adapter}",
                 "--out", str(tmp_path / "ih")]) == 0


def test_bench_rows_of_one_image_encode_it_once(vlm_adapter, tmp_path):
    """Bench rows have distinct keys but rows of one image share one processor pass (one prefix encode)."""
    from halsift.corpus.bench import read_bench
    from halsift.filtering.scoring.runner import score_bench

    bench = make_bench(tmp_path / "bench", captions=4)
    rows = read_bench(bench)
    det = load_detector(f"lora:{vlm_adapter}")
    calls = []
    orig = det.judge.features
    det.judge.features = lambda text, image: (calls.append(image), orig(text, image))[1]
    df = score_bench(det, bench, tmp_path / "s", batch_size=64, show_progress=False)
    assert len(df) == len(rows) > len({r.image for r in rows}) == len(calls)


@pytest.mark.parametrize("kind", ["vlm", "pmi", "lora"])
def test_decode_workers_give_the_same_scores(vlm_path, vlm_adapter, tmp_path, kind):
    """The VLM detectors' prepare step (processor, tokenization, PMI chains) in worker processes: same rows and
    scores as the in-process path."""
    import pyarrow.parquet as pq

    from halsift.filtering.scoring.workers import supports_workers

    refs = tmp_path / "refs"
    refs.mkdir()
    Image.new("RGB", (40, 40), (10, 30, 220)).save(refs / "a.png")
    spec = {"vlm": f"vlm:model={vlm_path},mode=yes_prob,dtype=float32,device=cpu,forward_batch=4",
            "pmi": f"vlm:model={vlm_path},mode=pmi,references={refs},n_references=1,dtype=float32,device=cpu",
            "lora": f"lora:{vlm_adapter}"}[kind]
    assert supports_workers(load_detector(spec))  # the workers path is taken, not the in-process fallback
    data = make_corpus(tmp_path / "data", shards=2, per_shard=3, corrupt={"s0_00001": "image"})
    for out, extra in ((tmp_path / "a", []), (tmp_path / "b", ["--decode-workers", "2"])):
        assert main(["score", "--detector", spec, "--data", str(data), "--out", str(out), "--no-progress",
                     "--batch-size", "3", *extra]) == 0
    parts = sorted(p.name for p in (tmp_path / "a").glob("part-*.parquet"))
    assert len(parts) == 2 and parts == sorted(p.name for p in (tmp_path / "b").glob("part-*.parquet"))
    for name in parts:
        a, b = pq.read_table(tmp_path / "a" / name), pq.read_table(tmp_path / "b" / name)
        assert a.num_rows > 0 and a.equals(b)


def test_set_level_detectors_are_refused_where_parts_are_scored_alone(tmp_path, monkeypatch):
    """Tasks and Ray actors score parts independently: a set-level detector would be normalised per part."""
    from halsift.execution.engines import EngineError, run_job

    data = make_corpus(tmp_path / "data", shards=1, per_shard=2)
    spec = "ensemble:members=[random:seed=1,random:seed=2],norm=zscore"
    with pytest.raises(EngineError, match="--num-tasks: .*set level"):
        run_job(ScoreJob(spec, data, tmp_path / "t", show_progress=False, num_tasks=2, task_index=0))
    monkeypatch.setattr("halsift.execution.engines.ray_module", lambda: object())  # refused before it is used
    with pytest.raises(EngineError, match="--engine ray: .*set level"):
        run_job(ScoreJob(spec, data, tmp_path / "r", show_progress=False), "ray")
    assert not (tmp_path / "r").exists() and not any((tmp_path / "t").glob("part-*"))
