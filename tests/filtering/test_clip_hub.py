"""open_clip weights by hf-hub:/local-dir: names, read from local files only; missing weights are one line, exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from halsift.filtering.detectors.clip import ClipDetector
from halsift.filtering.models.clip_models import register_builtin_configs
from halsift.launch.cli import main


@pytest.fixture()
def empty_offline_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache with downloads switched off: nothing can come from the network."""
    import huggingface_hub.constants as c

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def _tiny_folder(folder, seed: int = 1) -> dict:
    """open_clip_config.json + open_clip_model.safetensors of a halsift-tiny model (the hub repo layout)."""
    import open_clip
    from safetensors.torch import save_file

    register_builtin_configs()
    torch.manual_seed(seed)
    model = open_clip.create_model("halsift-tiny")
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"model_cfg": dict(open_clip.get_model_config("halsift-tiny")),
           "preprocess_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}}
    (folder / "open_clip_config.json").write_text(json.dumps(cfg))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "open_clip_model.safetensors"))
    return state


def test_missing_pretrained_offline_is_one_line_exit_2(tmp_path, empty_offline_cache, capsys):
    from filtering_data import make_bench

    bench = make_bench(tmp_path / "bench", captions=2)
    assert main(["score", "--detector", "clip:arch=ViT-B-32,pretrained=openai", "--data", str(bench),
                 "--out", str(tmp_path / "sc"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "pretrained='openai' of arch='ViT-B-32': weights could not be loaded" in err


def test_missing_pretrained_offline_names_the_tag(empty_offline_cache):
    with pytest.raises(ValueError, match=r"pretrained='openai' of arch='ViT-B-32': weights could not be loaded.*"
                                         r"HF_HUB_OFFLINE is set"):
        ClipDetector(arch="ViT-B-32", pretrained="openai")
    with pytest.raises(ValueError, match="arch='hf-hub:nobody/none': weights could not be loaded"):
        ClipDetector(arch="hf-hub:nobody/none")
    with pytest.raises(ValueError, match="not used with arch='hf-hub:nobody/none'"):
        ClipDetector(arch="hf-hub:nobody/none", pretrained="openai")


def test_hf_hub_name_from_the_local_cache(empty_offline_cache):
    snap = empty_offline_cache / "models--halsift--tiny-clip" / "snapshots" / ("a" * 40)
    state = _tiny_folder(snap)
    (empty_offline_cache / "models--halsift--tiny-clip" / "refs").mkdir()
    (empty_offline_cache / "models--halsift--tiny-clip" / "refs" / "main").write_text("a" * 40)
    det = ClipDetector(arch="hf-hub:halsift/tiny-clip")
    got = det.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in state.items())
    random_init = ClipDetector(arch="halsift-tiny", pretrained="random", seed=0).model.state_dict()
    assert not all(torch.equal(random_init[k], v) for k, v in state.items())


def test_local_dir_name(tmp_path, empty_offline_cache):
    state = _tiny_folder(tmp_path / "clip", seed=2)
    det = ClipDetector(arch=f"local-dir:{tmp_path / 'clip'}")
    assert all(torch.equal(det.model.state_dict()[k], v) for k, v in state.items())
