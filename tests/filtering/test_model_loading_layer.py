"""One model-loading layer (filtering/models): every stage builds open_clip models, Hugging Face VLMs and reads
weight files through it, so the safetensors-only rule and the one-line errors hold everywhere."""

import ast
from pathlib import Path

import pytest

from halsift.corpus.weights import WeightsFormatError, read_safetensors
from halsift.filtering.models.clip_models import load_clip
from halsift.filtering.models.hf_vlm import torch_dtype

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("api", "corpus", "eval", "filtering", "launch", "synth", "training")
LAYER = {"filtering/models/clip_models.py", "filtering/models/hf_vlm.py", "corpus/weights.py"}
# calls only the layer may make (training/engine.py's checkpoint hook reads accelerate's own checkpoint layout and
# raises the resume error; synth/ builds the world's tiny models from configs, it loads no user file)
ALLOWED = {("training/engine.py", "load_file")}


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name == "from_pretrained" and isinstance(f, ast.Attribute):
                name = f"{getattr(f.value, 'id', '')}.from_pretrained"
            names.add(name)
    return names


def test_only_the_layer_builds_models_or_reads_weight_files():
    forbidden = {"create_model_and_transforms", "load_file", "AutoModelForImageTextToText.from_pretrained"}
    offenders = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in LAYER:
                continue
            offenders += [(rel, c) for c in sorted(_calls(path) & forbidden) if (rel, c) not in ALLOWED]
    assert offenders == []


def test_load_clip_refuses_random_weights_unless_named_and_a_checkpoint_of_another_arch(tmp_path):
    from safetensors.torch import save_file
    import torch

    with pytest.raises(ValueError, match="no pretrained= or checkpoint= given"):
        load_clip("halsift-tiny")
    with pytest.raises(ValueError, match="give pretrained= or checkpoint=, not both"):
        load_clip("halsift-tiny", pretrained="random", checkpoint="x.safetensors")
    a, b = load_clip("halsift-tiny", pretrained="random", seed=3), load_clip("halsift-tiny", pretrained="random", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    bad = tmp_path / "other.safetensors"
    save_file({"visual.proj": torch.zeros(3, 3)}, str(bad))
    with pytest.raises(ValueError, match="does not fit arch 'halsift-tiny'"):
        load_clip("halsift-tiny", checkpoint=str(bad))
    pickled = tmp_path / "w.pt"
    torch.save({"x": torch.zeros(1)}, pickled)
    with pytest.raises(WeightsFormatError, match="not a safetensors file"):
        load_clip("halsift-tiny", checkpoint=str(pickled))


def test_a_damaged_weights_file_is_one_line_naming_it(tmp_path):
    damaged = tmp_path / "adapter_model.safetensors"
    damaged.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}")
    with pytest.raises(ValueError, match=r"adapter='.*adapter_model.safetensors': not a valid safetensors file"):
        read_safetensors(damaged, "adapter")
    with pytest.raises(ValueError, match="dtype='fp8'"):
        torch_dtype("fp8")
