"""Models halsift writes load in plain open_clip (``local-dir:FOLDER``) in a process that never imports halsift,
with the same preprocessing, embeddings and logits as halsift's own load (``clip:checkpoint=...``)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from filtering_data import write_png_shards

from halsift.launch.cli import main

CAPTIONS = ["a red square at the top left", "a blue square on white", "two green squares"]

# Plain open_clip, as a user without halsift runs it: no halsift import, no add_model_config.
PLAIN = r'''
import json, sys
import numpy as np, open_clip, torch
from PIL import Image

folder, image, out, captions = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
model.eval()
with torch.no_grad():
    pix = preprocess(Image.open(image)).unsqueeze(0)
    img, txt = model.encode_image(pix), model.encode_text(tokenizer(captions))
    n = lambda x: torch.nn.functional.normalize(x, dim=-1)
    logits = model.logit_scale.exp() * n(img) @ n(txt).T
    if getattr(model, "logit_bias", None) is not None:
        logits = logits + model.logit_bias
assert not [m for m in sys.modules if m.split(".")[0] == "halsift"], "halsift was imported"
assert "halsift-tiny" not in open_clip.list_models(), "halsift's configs were registered"
np.savez(out, pix=pix.numpy(), img=img.numpy(), txt=txt.numpy(), logits=logits.numpy())
'''


def _png(path: Path, seed: int) -> Path:
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)
    return path


def _plain_open_clip(folder: Path, image: Path, tmp: Path) -> dict:
    """Embeddings and logits from plain open_clip in a fresh process (PYTHONPATH cleared, cwd outside the repo)."""
    script, out = tmp / "plain.py", tmp / "plain.npz"
    script.write_text(PLAIN)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run([sys.executable, str(script), str(folder), str(image), str(out), json.dumps(CAPTIONS)],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return dict(np.load(out))


def _halsift(spec_opts: dict, image: Path) -> dict:
    """The same numbers from halsift's own load of the model (the clip detector)."""
    import torch
    from PIL import Image

    from halsift.filtering.detectors.clip import ClipDetector

    det = ClipDetector(precision="fp32", **spec_opts)
    m = det.model
    with torch.no_grad():
        pix = det.preprocess(Image.open(image)).unsqueeze(0)
        img, txt = m.encode_image(pix), m.encode_text(det.tokenizer(CAPTIONS))
        n = lambda x: torch.nn.functional.normalize(x, dim=-1)  # noqa: E731
        logits = m.logit_scale.exp() * n(img) @ n(txt).T
        if getattr(m, "logit_bias", None) is not None:
            logits = logits + m.logit_bias
    return {"pix": pix.numpy(), "img": img.numpy(), "txt": txt.numpy(), "logits": logits.numpy()}


def _assert_same(a: dict, b: dict) -> None:
    np.testing.assert_array_equal(a["pix"], b["pix"])  # the same preprocessing (size, crop, mean/std)
    for k in ("img", "txt", "logits"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from PIL import Image

    root = tmp_path_factory.mktemp("oc_shards")
    rng = np.random.default_rng(0)

    def png() -> bytes:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
        return buf.getvalue()

    return write_png_shards(root / "shards", [(png(), CAPTIONS[i % 3]) for i in range(16)], maxcount=8)


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_train_clip_final_loads_in_plain_open_clip(shards, tmp_path, loss):
    """``train clip``'s final/ is an open_clip ``local-dir:`` folder; a SigLIP fine-tune of an arch without a
    logit bias (the variant) loads with its trained bias."""
    out = tmp_path / "run"
    assert main(["train", "clip", "--data", str(shards), "--out", str(out), "--model", "halsift-tiny", "--steps", "2",
                 "--batch-size", "4", "--lr", "1e-2", "--warmup", "1", "--workers", "0", "--wandb-mode", "disabled",
                 "--loss", loss]) == 0
    final, image = out / "final", _png(tmp_path / "x.png", 1)
    plain = _plain_open_clip(final, image, tmp_path)
    cfg = json.loads((final / "open_clip_config.json").read_text())
    assert set(cfg) == {"model_cfg", "preprocess_cfg"} and cfg["model_cfg"]["embed_dim"] == 32
    _assert_same(plain, _halsift({"arch": "halsift-tiny", "checkpoint": str(final / "open_clip_model.safetensors")},
                                 image))
    _assert_same(plain, _halsift({"arch": f"local-dir:{final}"}, image))  # halsift reads the folder the same way
    if loss == "siglip":
        assert "init_logit_bias" in cfg["model_cfg"]


def test_merged_lora_clip_loads_in_plain_open_clip(tmp_path):
    """The LoRA detector's merged/ CLIP (another folder halsift writes) loads in plain open_clip too."""
    import torch

    from halsift.training.detector_config import DetectorTrainConfig
    from halsift.training.lora_clip import ClipTask

    task = ClipTask(DetectorTrainConfig(base="clip:arch=halsift-tiny,pretrained=random,seed=3"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained adapter: LoRA B is zero at init, which would merge into the base unchanged
        for n, p in task.peft.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    merged, image = tmp_path / "merged", _png(tmp_path / "x.png", 2)
    task.export_merged(merged)
    plain = _plain_open_clip(merged, image, tmp_path)
    ours = _halsift({"arch": "halsift-tiny", "checkpoint": str(merged / "open_clip_model.safetensors")}, image)
    _assert_same(plain, ours)
    base = _halsift({"arch": "halsift-tiny", "pretrained": "random", "seed": 3}, image)
    assert not np.allclose(base["txt"], ours["txt"], atol=1e-3)  # the adapter changed the model that was loaded
