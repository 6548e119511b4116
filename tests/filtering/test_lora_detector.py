"""The ``lora`` detector family: spec forms, loading an adapter folder, merge equivalence, and clear errors on
missing or corrupt files (a tiny clip adapter trained for two steps on a slice of the synthetic world)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from halsift.filtering.detectors.spec import SpecError, load_detector, parse_spec
from lora_data import small_bench


@pytest.fixture(scope="module")
def clip_adapter(synth_world, tmp_path_factory) -> tuple[Path, Path]:
    """(adapter folder with merged/, bench.jsonl) from a 2-step clip LoRA run."""
    from halsift.training.detector_config import DetectorTrainConfig
    from halsift.training.detector_train import train_detector

    root = tmp_path_factory.mktemp("lora_det")
    bench = small_bench(synth_world, root / "bench", {"train": 12, "val": 6, "test": 6})
    cfg = DetectorTrainConfig(base="clip:arch=halsift-tiny,pretrained=random,seed=3", bench=str(bench),
                              out=str(root / "run"), steps=2, batch_size=8, eval_every=2, lr=5e-2, warmup=0, merge=True,
                              wandb_mode="disabled")
    res = train_detector(cfg)
    return Path(res["adapter"]), bench


def _items(bench: Path):
    from halsift.training.detector_train import bench_examples, row_items, with_image

    rows = bench_examples(bench, "test")
    return [with_image(it) for it in row_items(bench, [r for r, _ in rows])]


def test_spec_positional_path_is_path_option():
    assert parse_spec("lora:/runs/a/adapter") == ("lora", {"path": "/runs/a/adapter"})
    assert parse_spec("lora:/runs/a,merge=true") == ("lora", {"path": "/runs/a", "merge": True})
    assert parse_spec("lora:path=/x") == ("lora", {"path": "/x"})
    with pytest.raises(SpecError, match="not key=value"):  # other families keep key=value only
        parse_spec("clip:/x")


def test_adapter_loads_by_spec_and_merging_keeps_scores(clip_adapter):
    adapter, bench = clip_adapter
    desc = __import__("yaml").safe_load((adapter / "detector.yaml").read_text())
    assert desc["kind"] == "clip" and desc["base"].startswith("clip:") and desc["adapter"] is True
    items = _items(bench)
    plain = load_detector(f"lora:{adapter}")
    assert plain.spec == f"lora:path={adapter}"
    assert plain.image_arrays and plain.inner.image_arrays  # the clip kind batches decoded arrays
    a = np.array([r.score for r in plain.score_batch(items)])
    b = np.array([r.score for r in load_detector(f"lora:{adapter},merge=true").score_batch(items)])
    c = np.array([r.score for r in load_detector(f"lora:{adapter / 'merged'}").score_batch(items)])
    assert ((a >= 0) & (a <= 100)).all() and np.ptp(a) > 0
    np.testing.assert_allclose(a, b, atol=1e-3)
    np.testing.assert_allclose(a, c, atol=1e-3)
    # the adapter changed the model: the same base without adapter scores differently
    base = load_detector(desc["base"])
    assert not np.allclose(a, [50 * (1 + x) for x in base.cosines(items).tolist()], atol=1e-3)


def test_scores_equal_independent_recomputation(clip_adapter):
    """100 * sigmoid(head([cos, img*txt])) recomputed by hand from peft-loaded towers and the head file."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    adapter, bench = clip_adapter
    items = _items(bench)[:4]
    desc = __import__("yaml").safe_load((adapter / "detector.yaml").read_text())
    base = load_detector(desc["base"])
    model = PeftModel.from_pretrained(base.model, str(adapter)).eval()
    head = load_file(str(adapter / "head.safetensors"))
    with torch.no_grad():
        img = torch.nn.functional.normalize(model.base_model.model.encode_image(
            torch.stack([base.preprocess(it.image) for it in items])), dim=-1)
        txt = torch.nn.functional.normalize(model.base_model.model.encode_text(
            base.tokenizer([it.sentence for it in items])), dim=-1)
        feats = torch.cat([(img * txt).sum(-1, keepdim=True), img * txt], -1)
        hidden = torch.nn.functional.gelu(feats @ head["mlp.0.weight"].T + head["mlp.0.bias"])
        logit = feats @ head["linear.weight"].T + head["linear.bias"] + hidden @ head["mlp.2.weight"].T \
            + head["mlp.2.bias"]
    want = (100 * torch.sigmoid(logit.squeeze(-1))).tolist()
    got = [r.score for r in load_detector(f"lora:{adapter}").score_batch(items)]
    np.testing.assert_allclose(got, want, atol=1e-3)


@pytest.mark.parametrize("breakage, named", [
    ("missing_weights", "adapter_model.safetensors"),
    ("corrupt_weights", "adapter_model.safetensors"),
    ("corrupt_config", "adapter_config.json"),
    ("missing_yaml", "detector.yaml"),
    ("bad_yaml", "detector.yaml"),
    ("missing_head", "head.safetensors"),
    ("corrupt_head", "head.safetensors"),
    ("wrong_keys", "adapter_model.safetensors"),
])
def test_broken_adapter_folder_names_the_file(clip_adapter, tmp_path, breakage, named):
    from safetensors.torch import load_file, save_file

    adapter, _ = clip_adapter
    broken = tmp_path / "adapter"
    shutil.copytree(adapter, broken)
    if breakage == "missing_weights":
        (broken / "adapter_model.safetensors").unlink()
    elif breakage == "corrupt_weights":
        data = (broken / "adapter_model.safetensors").read_bytes()
        (broken / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    elif breakage == "corrupt_config":
        (broken / "adapter_config.json").write_text("{not json")
    elif breakage == "missing_yaml":
        (broken / "detector.yaml").unlink()
    elif breakage == "bad_yaml":
        (broken / "detector.yaml").write_text("kind: [unclosed")
    elif breakage == "missing_head":
        (broken / "head.safetensors").unlink()
    elif breakage == "corrupt_head":
        (broken / "head.safetensors").write_bytes(b"\x00" * 17)
    elif breakage == "wrong_keys":
        state = load_file(str(broken / "adapter_model.safetensors"))
        k = sorted(state)[0]
        state[k + ".renamed"] = state.pop(k)
        save_file(state, str(broken / "adapter_model.safetensors"))
    with pytest.raises((SpecError, FileNotFoundError, ValueError), match=re.escape(named)) as err:
        load_detector(f"lora:{broken}")
    assert named in str(err.value) and str(broken) in str(err.value)


def test_missing_folder_and_cli_exit_2(tmp_path, capsys):
    from halsift.launch.cli import main

    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_detector(f"lora:{tmp_path / 'nowhere'}")
    bench = tmp_path / "b.jsonl"
    bench.write_text("")
    rc = main(["score", "--detector", f"lora:{tmp_path / 'nowhere'}", "--data", str(bench),
               "--out", str(tmp_path / "s")])
    assert rc == 2 and "nowhere" in capsys.readouterr().err


def test_detector_yaml_kind_is_checked(clip_adapter, tmp_path):
    adapter, _ = clip_adapter
    broken = tmp_path / "adapter"
    shutil.copytree(adapter, broken)
    text = (broken / "detector.yaml").read_text().replace("kind: clip", "kind: vlm")
    (broken / "detector.yaml").write_text(text)
    with pytest.raises((SpecError, ValueError), match="detector.yaml"):
        load_detector(f"lora:{broken}")
    json.loads((adapter / "adapter_config.json").read_text())  # the original is untouched


def test_bench_rows_sharing_an_image_encode_it_once(clip_adapter, tmp_path):
    """Bench rows have distinct keys (row ids) but rows of one image share one decoded image: the LoRA clip
    detector encodes each image once per batch, and scores as when every row is scored alone."""
    from halsift.corpus.bench import read_bench
    from halsift.filtering.scoring.runner import score_bench

    adapter, bench = clip_adapter
    det = load_detector(f"lora:{adapter}")
    encoded = []
    clip = det.inner.scorer.clip
    orig = clip.encode_image
    clip.encode_image = lambda pix, *a, **k: (encoded.append(pix.shape[0]), orig(pix, *a, **k))[1]
    rows = read_bench(bench)
    df = score_bench(det, bench, tmp_path / "s", batch_size=4096, show_progress=False)
    images = {r.image for r in rows}
    assert len(df) == len(rows) > len(images)  # the check is not vacuous: images are shared by several rows
    assert sum(encoded) == len(images)
    items = _items(bench)[:5]
    alone = [det.score_batch([it])[0].score for it in items]
    together = [r.score for r in det.score_batch(items)]
    np.testing.assert_allclose(together, alone, atol=1e-4)


def test_clip_adapter_prepare_in_decode_workers_gives_the_same_parts(clip_adapter, tmp_path):
    """The clip kind's CPU half (preprocessing, tokenization) in ``score --decode-workers`` processes: the same
    parts, bit for bit, as the in-process path."""
    import pyarrow.parquet as pq
    from filtering_data import make_corpus

    from halsift.filtering.scoring.workers import supports_workers
    from halsift.launch.cli import main

    adapter, _ = clip_adapter
    assert supports_workers(load_detector(f"lora:{adapter}"))
    data = make_corpus(tmp_path / "data", shards=2, per_shard=3)
    for out, extra in ((tmp_path / "a", []), (tmp_path / "b", ["--decode-workers", "2"])):
        assert main(["score", "--detector", f"lora:{adapter}", "--data", str(data), "--out", str(out),
                     "--no-progress", "--batch-size", "4", *extra]) == 0
    parts = sorted(p.name for p in (tmp_path / "a").glob("part-*.parquet"))
    assert len(parts) == 2 and parts == sorted(p.name for p in (tmp_path / "b").glob("part-*.parquet"))
    for name in parts:
        a, b = pq.read_table(tmp_path / "a" / name), pq.read_table(tmp_path / "b" / name)
        assert a.num_rows > 0 and a.equals(b)
