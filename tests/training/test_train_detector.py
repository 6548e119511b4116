"""`halsift train detector`: LoRA on tiny clip / vlm detectors on a slice of the synthetic world; the adapters load
by spec (`lora:DIR`), score shards through the runner and evaluate on the bench; 2-process training; resume;
early stopping; the judge's training target equals its own score. The AUROC-target runs are marked slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from halsift.launch.cli import main
from lora_data import small_bench, small_shards

CLIP = "clip:arch=halsift-tiny,pretrained=random,seed=1"


@pytest.fixture(scope="module")
def data(synth_world, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("train_det")
    return {"bench": small_bench(synth_world, root / "bench", {"train": 10, "val": 4, "test": 4}),
            "shards": small_shards(synth_world, root / "shards", 4), "world": synth_world}


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    from halsift.synth.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm("llava", tmp_path_factory.mktemp("llava") / "m", seed=0, init_std=0.5)


def _cfg(**kw):
    from halsift.training.detector_config import DetectorTrainConfig

    base = dict(steps=4, batch_size=8, eval_every=2, lr=5e-2, warmup=0, max_val_rows=12, wandb_mode="disabled")
    return DetectorTrainConfig(**{**base, **kw})


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _shard_items(shards: Path) -> list:
    """Every ground-truth sentence of the shards as an Item with its own decoded image and preceding sentences."""
    import io

    from PIL import Image

    from halsift.corpus.shards import iter_samples
    from halsift.filtering.detectors.base import Item

    items = []
    for s in iter_samples(shards):
        texts = [x["text"] for x in s.meta["sentences"]]
        image = Image.open(io.BytesIO(s.image)).convert("RGB")
        items += [Item(s.key, j, t, texts[:j], image, s.key) for j, t in enumerate(texts)]
    return items


def _same_scores(scores, det, items) -> None:
    """The runner's score of each (key, sentence) equals the detector's own score of that item."""
    want = {(it.key, it.sentence_index): r.score for it, r in zip(items, det.score_batch(items))}
    got = {(k, int(i)): float(v) for k, i, v in zip(scores["key"], scores["sentence_index"], scores["score"])}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-3), k


def test_clip_cli_train_score_shards_and_eval_bench(data, tmp_path):
    from PIL import Image
    from sklearn.metrics import roc_auc_score

    from halsift.corpus.bench import read_bench
    from halsift.corpus.scores import read_scores_df
    from halsift.filtering.detectors.base import Item
    from halsift.filtering.detectors.spec import load_detector
    from halsift.filtering.scoring.runner import score

    out = tmp_path / "run"
    rc = main(["train", "detector", "--base", CLIP, "--bench", str(data["bench"]), "--out", str(out),
               "--steps", "3", "--batch-size", "8", "--eval-every", "2", "--lr", "0.05", "--warmup", "0",
               "--wandb-mode", "offline"])
    assert rc == 0
    lines = _lines(out)
    assert [x["step"] for x in lines if "val/auroc" in x] == [0, 2, 3]  # base, every 2 steps, the end
    assert sum("train/loss" in x for x in lines) == 1 and (out / "wandb").is_dir()
    result = json.loads((out / "result.json").read_text())
    best = max((x for x in lines if "val/auroc" in x), key=lambda x: (x["val/auroc"], -x["step"]))
    assert result["best_step"] == best["step"]
    adapter = out / "adapter"
    assert {"adapter_model.safetensors", "adapter_config.json", "head.safetensors", "detector.yaml"} <= \
        {p.name for p in adapter.iterdir()}
    # score shards through the runner by spec
    scores = read_scores_df(score(f"lora:{adapter}", data["shards"], tmp_path / "scores", show_progress=False))
    det = load_detector(f"lora:{adapter}")
    _same_scores(scores, det, _shard_items(data["shards"]))
    assert set(scores["detector"]) == {f"lora:path={adapter}"}
    base = load_detector(CLIP)  # the adapter is not its base
    items = _shard_items(data["shards"])
    assert max(abs(a.score - b.score) for a, b in zip(det.score_batch(items), base.score_batch(items))) > 1e-3
    # and evaluate on the bench
    rc = main(["eval", "bench", "--bench", str(data["bench"]), "--detector", f"lora:{adapter}", "--out",
               str(tmp_path / "ev"), "--n-boot", "10", "--no-plots"])
    assert rc == 0
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    rows = read_bench(data["bench"])  # each row scored by the adapter with its own image; sklearn's AUROC
    ims = {r.image: Image.open(data["bench"].parent / r.image).convert("RGB") for r in rows}
    got = det.score_batch([Item(r.id, r.position, r.sentence, [], ims[r.image], r.id) for r in rows])
    by_gen: dict = {}
    for r, res in zip(rows, got):
        if r.label in ("correct", "incorrect"):
            by_gen.setdefault(r.generator, ([], []))[0].append(r.label == "correct")
            by_gen[r.generator][1].append(res.score)
    want = {f"auroc/{g}": 100 * roc_auc_score(y, v) for g, (y, v) in by_gen.items() if 0 < sum(y) < len(y)}
    assert want and metrics["bench/n_rows"] == len(rows)
    assert {k: v for k, v in metrics.items() if k in want or k == "auroc/mean"} == pytest.approx(
        {**want, "auroc/mean": sum(want.values()) / len(want)}, abs=1e-6)


def test_vlm_judge_target_equals_its_score_and_loads(data, tiny_llava, tmp_path):
    """sigmoid(training logit) * 100 == the detector's score on the same rows, for yes_prob and logits."""
    from halsift.filtering.scoring.runner import score
    from halsift.filtering.detectors.spec import load_detector
    from halsift.corpus.scores import read_scores_df
    from halsift.training.detector_train import bench_examples, row_items, train_detector, with_image
    from halsift.training.lora_vlm import VlmTask, judge_scores

    rows = bench_examples(data["bench"], "val")[:5]
    items = [with_image(it) for it in row_items(data["bench"], [r for r, _ in rows])]
    for mode in ("yes_prob", "logits"):
        task = VlmTask(_cfg(base=f"vlm:model={tiny_llava},mode={mode}", bench=str(data["bench"]), out="x"))
        with torch.no_grad():
            batch = task.collate([(it, y) for it, (_, y) in zip(items, rows)])
            batch.pop("labels")
            logits = task.forward(task.module, batch, "cpu")
        det = task.detector(task.module)
        want = np.array([r.score for r in det.score_batch(items)])
        np.testing.assert_allclose(100 * torch.sigmoid(logits).numpy(), want, atol=0.02)
        k = task.module.k
        raw = task.module.model(**batch, use_cache=False, logits_to_keep=k).logits[:, -k:]
        np.testing.assert_allclose(judge_scores(det, raw).detach().numpy(), det._scores_from_logits(raw), atol=1e-4)

    out = tmp_path / "vlm"
    res = train_detector(_cfg(base=f"vlm:model={tiny_llava},mode=yes_prob", bench=str(data["bench"]),
                              out=str(out), steps=2, batch_size=4, max_val_rows=8, lr=1e-2,
                              modules_to_save=["multi_modal_projector"], merge=True))
    desc = __import__("yaml").safe_load((Path(res["adapter"]) / "detector.yaml").read_text())
    assert desc["kind"] == "vlm" and desc["mode"] == "yes_prob"
    det = load_detector(f"lora:{res['adapter']}")
    got = np.array([r.score for r in det.score_batch(items)])
    merged = np.array([r.score for r in load_detector(f"lora:{res['adapter']}/merged").score_batch(items)])
    np.testing.assert_allclose(got, merged, atol=1e-3)
    base = np.array([r.score for r in load_detector(f"vlm:model={tiny_llava},mode=yes_prob").score_batch(items)])
    assert np.abs(got - base).max() > 1e-3  # the adapter (trained 2 steps at a high lr) changed the judge
    scores = read_scores_df(score(f"lora:{res['adapter']}", data["shards"], tmp_path / "s", batch_size=16,
                                  show_progress=False))
    _same_scores(scores, det, _shard_items(data["shards"]))


def test_vlm_training_processes_each_image_once_and_batches_as_before(data, tiny_llava, monkeypatch):
    """The judge's training batches reuse each image's processor features: every distinct image is processed once
    over many batches, and each batch equals the one built from freshly processed features."""
    from halsift.training.detector_train import bench_examples, row_items, with_image
    from halsift.training.lora_vlm import VlmTask

    rows = bench_examples(data["bench"], "train")[:12]
    items = [with_image(it) for it in row_items(data["bench"], [r for r, _ in rows])]
    examples = [(it, y) for it, (_, y) in zip(items, rows)]
    task = VlmTask(_cfg(base=f"vlm:model={tiny_llava},mode=yes_prob", bench=str(data["bench"]), out="x"))
    calls = []
    real = task.det.prefix_inputs
    monkeypatch.setattr(task.det, "prefix_inputs", lambda image: calls.append(image) or real(image))
    batches = [task.collate(examples[i:i + 5]) for i in (0, 3, 6, 0, 7)]
    assert len(calls) == len({it.image_id for it in items[:12]})
    fresh = task.det.judge.full_batch([real(it.image) for it, _ in examples[0:5]],
                                      [task.det.continuation_ids(it) for it, _ in examples[0:5]])
    for b in (batches[0], batches[3]):
        assert all(torch.equal(b[k], fresh[k]) for k in fresh)


def test_two_process_cpu_training(data, tmp_path):
    out = tmp_path / "ddp"
    env = dict(os.environ, HALSIFT_QUIET="1", WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "halsift.launch.cli", "train", "detector", "--base", CLIP, "--bench", str(data["bench"]),
           "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-every", "2", "--warmup", "0",
           "--wandb-mode", "disabled"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((out / "run_info.json").read_text())
    assert info["world_size"] == 2 and "MULTI_CPU" in info["distributed_type"]
    state = json.loads((out / "checkpoints" / "step_000002" / "state.json").read_text())
    assert state["world_size"] == 2
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


def test_resume_continues_from_checkpoint(data, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import halsift.training.detector_train as dt
    from halsift.training import engine

    straight = dt.train_detector(_cfg(base=CLIP, bench=str(data["bench"]), out=str(tmp_path / "a")))
    real = engine.save_checkpoint

    def save_then_die(acc, out, step, *a, **kw):
        path = real(acc, out, step, *a, **kw)
        if step == 2:
            raise KeyboardInterrupt("simulated kill after step 2's checkpoint")
        return path

    monkeypatch.setattr(engine, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt, match="^simulated kill after step 2's checkpoint$"):
        dt.train_detector(_cfg(base=CLIP, bench=str(data["bench"]), out=str(tmp_path / "b")))
    monkeypatch.setattr(engine, "save_checkpoint", real)
    assert not (tmp_path / "b" / "checkpoints" / "step_000004").exists()
    resumed = dt.train_detector(_cfg(base=CLIP, bench=str(data["bench"]), out=str(tmp_path / "b"), resume=True))
    a = load_file(str(tmp_path / "a" / "checkpoints" / "step_000004" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "checkpoints" / "step_000004" / "model.safetensors"))
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)
    assert resumed["best_step"] == straight["best_step"]
    assert [x["step"] for x in _lines(tmp_path / "b")] == [x["step"] for x in _lines(tmp_path / "a")]


def test_early_stopping_keeps_the_best_step(data, tmp_path, monkeypatch):
    import halsift.training.detector_train as dt

    seq = iter([70.0, 72.0, 71.0, 69.0, 68.0, 90.0])  # best at step 2, then two worse evaluations
    monkeypatch.setattr(dt, "val_auroc", lambda *a, **k: {"val/auroc": next(seq)})
    res = dt.train_detector(_cfg(base=CLIP, bench=str(data["bench"]), out=str(tmp_path / "es"), steps=20,
                                 eval_every=2, patience=2))
    assert res["best_step"] == 2 and res["last_step"] == 6 and res["val/auroc"] == 72.0
    desc = __import__("yaml").safe_load((tmp_path / "es" / "adapter" / "detector.yaml").read_text())
    assert desc["step"] == 2


def test_step_batches_balanced_deterministic_and_disjoint():
    from halsift.training.detector_train import StepBatches

    labels = np.array([1] * 90 + [0] * 10)
    r0 = list(StepBatches(labels, 50, 0, 0, 40, 0, 2, "sample"))
    r1 = list(StepBatches(labels, 50, 0, 0, 40, 1, 2, "sample"))
    frac = np.mean([labels[b].mean() for b in r0 + r1])
    assert 0.42 < frac < 0.58  # class-balanced sampling, vs 0.9 in the data
    assert list(StepBatches(labels, 50, 0, 5, 40, 0, 2, "sample")) == r0[5:]  # resume replays the same batches
    u0 = list(StepBatches(labels, 20, 0, 0, 3, 0, 2, "none"))
    u1 = list(StepBatches(labels, 20, 0, 0, 3, 1, 2, "none"))
    for a, b in zip(u0, u1):  # without replacement within a step: ranks never share a row
        assert not set(a) & set(b) and len(a) == len(b) == 20


@pytest.mark.parametrize("argv, named", [
    (["--base", "random:seed=0"], "--base"),
    (["--steps", "0"], "--steps"),
    (["--balance", "maybe"], "--balance"),
    (["--mode", "prompt"], "--mode"),
])
def test_bad_flags_exit_2(data, tmp_path, capsys, argv, named):
    base = ["train", "detector", "--base", CLIP, "--bench", str(data["bench"]), "--out", str(tmp_path / "o")]
    rc = main(base + argv)
    assert rc == 2 and named in capsys.readouterr().err


def test_world_judge_is_deterministic_and_cached(synth_world, tmp_path):
    """Two builds with the same seed give identical adapters; a third call returns the cached spec at once; the
    spec (judge + captioner PMI ensemble) loads and scores bench rows; ``pmi_references=0`` is the judge alone."""
    import dataclasses

    from safetensors.torch import load_file

    from halsift.corpus.bench import read_bench, write_bench, write_image_roots
    from halsift.filtering.scoring.runner import score_bench
    from halsift.filtering.detectors.spec import load_detector
    from halsift.synth.world_judge import WorldJudgeSettings, build_world_judge, world_judge_spec

    tiny = WorldJudgeSettings(pretrain_steps=2, pretrain_batch=4, judge_steps=2, judge_batch=4, eval_every=2,
                              extra_images=3, swap_negatives=0.5, pmi_references=2)
    a = build_world_judge(synth_world, tmp_path / "a", seed=0, settings=tiny)
    b = build_world_judge(synth_world, tmp_path / "b", seed=0, settings=tiny)
    assert a == world_judge_spec(tmp_path / "a", tiny) and a.startswith("ensemble:") and "mode=pmi" in a
    wa = load_file(str(tmp_path / "a" / "judge" / "adapter" / "adapter_model.safetensors"))
    wb = load_file(str(tmp_path / "b" / "judge" / "adapter" / "adapter_model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert sorted(p.name for p in (tmp_path / "a" / "references").iterdir()) == ["ref000.png", "ref001.png"]
    few = tmp_path / "few.jsonl"
    rows = [r for r in read_bench(synth_world / "bench" / "bench.jsonl") if r.split == "test"][:12]
    write_bench(few, [dataclasses.replace(r, image=str(synth_world / "bench" / r.image)) for r in rows])
    write_image_roots(few, [synth_world / "bench"])  # its images are in the world's bench folder: allowed by name
    for spec in (a, f"lora:{tmp_path / 'a' / 'judge' / 'adapter'}"):
        scores = score_bench(load_detector(spec), few, show_progress=False)
        assert len(scores) == 12 and scores.score.between(0, 100).all() and scores.score.nunique() > 1
    more = dataclasses.replace(tiny, pmi_references=3)  # a scoring knob: the trained models are reused
    stamp = (tmp_path / "a" / "judge.json").stat().st_mtime_ns
    assert build_world_judge(synth_world, tmp_path / "a", seed=0, settings=more) == world_judge_spec(tmp_path / "a", more)
    assert (tmp_path / "a" / "judge.json").stat().st_mtime_ns == stamp
    assert len(list((tmp_path / "a" / "references").glob("ref*.png"))) == 3
    alone = dataclasses.replace(tiny, pmi_references=0)
    assert world_judge_spec(tmp_path / "a", alone) == f"lora:{(tmp_path / 'a' / 'judge' / 'adapter').resolve()}"
    rows = read_bench(tmp_path / "a" / "judge_data" / "bench.jsonl")
    by_id = {r.id: r for r in rows}
    swaps = [r for r in rows if r.id.endswith("-swap")]
    assert swaps and all(r.split == "train" and r.label == "incorrect" for r in swaps)
    for r in swaps:  # the same correct train sentence, with another image
        src = by_id[r.id.removesuffix("-swap")]
        assert src.label == "correct" and src.sentence == r.sentence and src.image_id != r.image_id
    assert all(r.split == "train" for r in rows if r.image_id.startswith("judge"))
    stamp = (tmp_path / "a" / "judge.json").stat().st_mtime_ns
    assert build_world_judge(synth_world, tmp_path / "a", seed=0, settings=tiny) == a
    assert (tmp_path / "a" / "judge.json").stat().st_mtime_ns == stamp


def _tiny_clip_weights(path: Path) -> Path:
    """A random halsift-tiny open_clip model saved as safetensors (as ``train clip`` writes it)."""
    import open_clip
    from safetensors.torch import save_file

    from halsift.training.clip_config import ensure_model_configs

    ensure_model_configs()
    torch.manual_seed(0)
    model = open_clip.create_model("halsift-tiny")
    with torch.no_grad():  # non-trivial norms and biases, so that a mis-mapped weight shows
        for n, p in model.visual.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_open_clip_vision_converts_to_hf_clip_exactly(tmp_path):
    """halsift-tiny's open_clip visual tower as an HF CLIPVisionModel: post_layernorm(CLS) @ proj == encode_image."""
    from transformers import CLIPVisionModel

    from halsift.synth.tiny_vlm import load_hf_vision, load_open_clip_visual, open_clip_vision_to_hf

    weights = _tiny_clip_weights(tmp_path / "clip.safetensors")
    visual, preprocess = load_open_clip_visual(weights)
    cfg, sd = open_clip_vision_to_hf(visual)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.image_size, cfg.patch_size, cfg.hidden_act) == (64, 256, 2, 2, 64, 16, "gelu")
    hf = CLIPVisionModel(cfg).eval()
    load_hf_vision(hf, sd)
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        want = visual(x)
        got = hf(pixel_values=x).pooler_output @ visual.proj
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_world_judge_with_clip_vision_tower(synth_world, tmp_path):
    """vision_from: the judge's base carries the CLIP tower and open_clip's preprocessing; it builds and caches."""
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from halsift.synth.tiny_vlm import load_open_clip_visual
    from halsift.synth.world_judge import WorldJudgeSettings, build_world_judge

    weights = _tiny_clip_weights(tmp_path / "clip.safetensors")
    tiny = WorldJudgeSettings(pretrain_steps=2, pretrain_batch=4, judge_steps=2, judge_batch=4, eval_every=2,
                              vision_from=str(weights))
    spec = build_world_judge(synth_world, tmp_path / "j", seed=0, settings=tiny)
    assert build_world_judge(synth_world, tmp_path / "j", seed=0, settings=tiny) == spec
    base = LlavaForConditionalGeneration.from_pretrained(str(tmp_path / "j" / "base")).eval()
    pre = LlavaForConditionalGeneration.from_pretrained(str(tmp_path / "j" / "pretrained")).eval()
    proc = AutoProcessor.from_pretrained(str(tmp_path / "j" / "base"))
    visual, preprocess = load_open_clip_visual(weights)
    img = Image.new("RGB", (64, 64), (200, 40, 90))
    pix = proc.image_processor(images=[img], return_tensors="pt")["pixel_values"]
    assert pix.shape[-2:] == (64, 64)
    assert torch.allclose(pix, preprocess(img)[None], atol=1e-3)
    with torch.no_grad():
        got = base.model.vision_tower(pixel_values=pix).pooler_output @ visual.proj
        assert torch.allclose(got, visual(pix), atol=1e-4)
    vt, vp = base.model.vision_tower.state_dict(), pre.model.vision_tower.state_dict()
    assert all(torch.equal(vt[k], vp[k]) for k in vt)  # frozen during caption pre-training


# ---------------------------------------------------------------------------------------------- the numbers
@pytest.mark.slow
def test_world_judge_reaches_target_auroc(tmp_path):
    """The embedded world's VLM judge as the quickstart builds it: a CLIP vision tower pre-trained on the world's
    pretrain/ (6000 clean pairs), caption pre-training, LoRA yes/no tuning, z-scored with the captioner's image PMI
    (a few CPU minutes): test-split AUROC >= 75, and it reads the image (shuffled images score clearly lower)."""
    from halsift.synth.world import generate_world
    from halsift.training.clip_config import ClipTrainConfig
    from halsift.training.clip_train import train
    from halsift.synth.world_judge import WorldJudgeSettings, build_world_judge

    world = tmp_path / "world"
    generate_world(world, images=1200, seed=0, pretrain_images=6000)
    train(ClipTrainConfig(data=[str(world / "pretrain")], out=str(tmp_path / "clip"), model="halsift-tiny",
                          steps=400, batch_size=64, lr=1e-3, warmup=40, wandb_mode="disabled", seed=0, workers=0))
    settings = WorldJudgeSettings(vision_from=str(tmp_path / "clip" / "final" / "open_clip_model.safetensors"))
    spec = build_world_judge(world, tmp_path / "judge", seed=0, settings=settings)
    assert build_world_judge(world, tmp_path / "judge", seed=0, settings=settings) == spec  # cached
    auc = _test_auroc(spec, world / "bench" / "bench.jsonl", tmp_path)
    shuffled = _test_auroc(spec, world / "bench" / "bench.jsonl", tmp_path, shuffled=True)
    print(f"world judge test AUROC {auc:.2f} (shuffled images {shuffled:.2f})")
    assert auc >= 75 and shuffled < auc - 3


def _test_auroc(spec: str, bench: Path, tmp: Path, shuffled: bool = False, split: str = "test") -> float:
    """Pooled AUROC on a split (test); ``shuffled``: each image replaced by another (a fixed derangement)."""
    from halsift.corpus.bench import read_bench, with_shuffled_images, write_bench
    from halsift.eval.runs.bench_eval import bench_frame, join_scores
    from halsift.eval.metrics.detection import auroc, labelled
    from halsift.filtering.scoring.runner import score_bench
    from halsift.filtering.detectors.spec import load_detector

    test = bench.with_name(f"bench_{split}_shuffled.jsonl" if shuffled else f"bench_{split}.jsonl")
    rows = [r for r in read_bench(bench) if r.split == split]
    write_bench(test, with_shuffled_images(rows) if shuffled else rows)
    det = load_detector(spec)
    df, _, _ = join_scores(bench_frame(test), score_bench(det, test, show_progress=False), det.name)
    df = labelled(df)
    return auroc(df.label, df.score)


@pytest.mark.slow
def test_lora_clip_beats_its_untuned_base(tmp_path):
    """A base CLIP pre-trained briefly on pretrain/, then LoRA-tuned on the bench: higher test-split AUROC."""
    from halsift.synth.world import generate_world
    from halsift.training.clip_config import ClipTrainConfig
    from halsift.training.clip_train import train
    from halsift.training.detector_train import train_detector

    world = tmp_path / "world"
    generate_world(world, images=1200, seed=0)
    train(ClipTrainConfig(data=[str(world / "pretrain")], out=str(tmp_path / "clip"), model="halsift-tiny", steps=400,
                          batch_size=64, lr=1e-3, warmup=20, workers=1, wandb_mode="disabled", seed=0, log_every=50))
    base = f"clip:arch=halsift-tiny,checkpoint={tmp_path / 'clip' / 'final' / 'open_clip_model.safetensors'}"
    res = train_detector(_cfg(base=base, bench=str(world / "bench" / "bench.jsonl"), out=str(tmp_path / "lora"),
                              steps=300, batch_size=64, eval_every=50, lr=1e-3, warmup=10, max_val_rows=0))
    bench = world / "bench" / "bench.jsonl"
    tuned, untuned = _test_auroc(f"lora:{res['adapter']}", bench, tmp_path), _test_auroc(base, bench, tmp_path)
    print(f"clip test AUROC: base {untuned:.2f}, LoRA {tuned:.2f}")
    assert tuned > untuned


def test_lora_clip_fits_its_training_rows(data, tmp_path):
    """The CI-sized check that training improves the detector: 20 steps on the 63 train rows (8 incorrect) of the
    small bench raise the AUROC on those rows well above the base's. (Seeds 0-9 of base and training: base 36-78,
    tuned 83-100, gain >= 19.8.) The generalising claims (test split, a pre-trained base) are the slow tests below."""
    from halsift.training.detector_train import train_detector

    base = "clip:arch=halsift-tiny,pretrained=random,seed=1"
    res = train_detector(_cfg(base=base, bench=str(data["bench"]), out=str(tmp_path / "fit"), steps=20, batch_size=16,
                              lr=5e-3, val_split="", seed=1))
    desc = __import__("yaml").safe_load((Path(res["adapter"]) / "detector.yaml").read_text())
    assert res["last_step"] == desc["step"] == 20  # no validation: the last step is exported
    untuned = _test_auroc(base, data["bench"], tmp_path, split="train")
    tuned = _test_auroc(f"lora:{res['adapter']}", data["bench"], tmp_path, split="train")
    assert tuned >= 75 and tuned >= untuned + 10, (untuned, tuned)


def test_nonfinite_loss_stops_before_the_next_save(data, tmp_path, monkeypatch):
    """The loss stays on the device between log/eval/checkpoint steps; a NaN at step 3 is caught before step 4's
    evaluation and checkpoint: stopped with the step and value, no adapter exported."""
    import torch

    import halsift.training.detector_train as dt

    real, calls = torch.nn.functional.binary_cross_entropy_with_logits, {"n": 0}

    def poisoned(*a, **kw):
        calls["n"] += 1
        loss = real(*a, **kw)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr(torch.nn.functional, "binary_cross_entropy_with_logits", poisoned)
    with pytest.raises(FloatingPointError, match="loss is nan at step 3; stopped without saving"):
        dt.train_detector(_cfg(base=CLIP, bench=str(data["bench"]), out=str(tmp_path / "nan"), steps=6, eval_every=2,
                               log_every=10))
    assert not (tmp_path / "nan" / "adapter").exists()
    assert sorted(p.name for p in (tmp_path / "nan" / "checkpoints").iterdir()) == ["step_000002"]



def test_two_identical_trainings_write_the_same_adapter_files(data, tmp_path):
    """Two processes with different string hashes train the same LoRA CLIP detector into the same folder: every
    adapter file is the same byte for byte (peft's ``target_modules`` set sorted, the head's size in one metadata
    key), so the detector's fingerprint, and with it every score made with it, is the same; an earlier head file
    (two metadata keys) still loads."""
    import os
    import subprocess
    import sys

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from halsift.corpus.fingerprint import spec_fingerprint
    from halsift.filtering.detectors.lora import load_head

    out, files, prints = tmp_path / "run", [], []
    for seed in ("1", "2"):
        subprocess.run([sys.executable, "-m", "halsift.launch.cli", "train", "detector", "--base", CLIP, "--bench",
                        str(data["bench"]), "--out", str(out), "--steps", "2", "--batch-size", "8", "--eval-every",
                        "2", "--lr", "0.05", "--warmup", "0", "--wandb-mode", "disabled"], check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True)
        files.append({p.name: p.read_bytes() for p in (out / "adapter").iterdir()})
        prints.append(spec_fingerprint(f"lora:{out / 'adapter'}"))
        os.rename(out, tmp_path / f"run{seed}")
    assert {"adapter_config.json", "adapter_model.safetensors", "head.safetensors", "detector.yaml"} <= files[0].keys()
    assert files[0] == files[1] and prints[0] == prints[1]
    targets = json.loads(files[0]["adapter_config.json"])["target_modules"]
    assert len(targets) > 1 and targets == sorted(targets)
    head, old = tmp_path / "run1" / "adapter" / "head.safetensors", tmp_path / "old_head.safetensors"
    with safe_open(str(head), "pt") as f:
        dims = json.loads(f.metadata()["head"])
    save_file(load_file(str(head)), str(old), metadata={"dim": str(dims["dim"]), "hidden": str(dims["hidden"])})
    assert all(torch.equal(a, b) for a, b in zip(load_head(old).state_dict().values(),
                                                  load_head(head).state_dict().values()))
