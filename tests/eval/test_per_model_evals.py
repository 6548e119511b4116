"""A recipe's per-model evaluations (the registry's ``per_model`` entries, run by :func:`evaluate_models`) give, for
each set, the numbers `halsift eval retrieval|zeroshot|compositional` gives for the same model and set: one library
function per model under both."""

from __future__ import annotations

import json

import pytest

from halsift.launch.cli import main


@pytest.fixture(scope="module")
def world_and_weights(tmp_path_factory):
    """A tiny synthetic world's evaluation sets and a seeded random halsift-tiny saved as a weights file."""
    import torch
    from safetensors.torch import save_model

    from halsift.filtering.models.clip_models import load_open_clip

    root = tmp_path_factory.mktemp("per_model")
    assert main(["synth", "--out", str(root / "world"), "--images", "20", "--bench-images", "4", "--t2i-prompts", "2",
                 "--pretrain-images", "0", "--retrieval-images", "12", "--zeroshot-images", "12",
                 "--compositional-images", "12"]) == 0
    torch.manual_seed(0)
    model = load_open_clip("halsift-tiny", None)[0]
    save_model(model, str(root / "tiny.safetensors"))
    return root / "world", str(root / "tiny.safetensors")


def test_the_recipe_and_the_commands_give_the_same_numbers(world_and_weights, tmp_path):
    from halsift.eval.registry import per_model_evals
    from halsift.eval.runs.per_model import evaluate_models

    world, weights = world_and_weights
    tasks = sorted(d.name for d in (world / "zeroshot").iterdir() if d.is_dir())
    assert tasks == ["colour", "count", "shape"]
    sets = {"retrieval": {"synthetic": str(world / "retrieval")},
            "zeroshot": {t: str(world / "zeroshot" / t) for t in tasks},
            "compositional": {"compositional": str(world / "compositional")}}
    got = evaluate_models({"m": [weights]}, "halsift-tiny", per_model_evals(), sets, tmp_path, "cpu", 16, "fp32")
    retrieval, beyond = got["retrieval.json"]["m"][0], got["beyond.json"]["m"][0]

    def command(name: str, data, out: str) -> dict:
        assert main(["eval", name, "--model", "halsift-tiny", "--pretrained", weights, "--device", "cpu",
                     "--batch-size", "16", "--precision", "fp32", "--data", str(data),
                     "--out", str(tmp_path / out)]) == 0
        return json.loads((tmp_path / out / "metrics.json").read_text())

    cli = command("retrieval", world / "retrieval", "r")
    assert {k: retrieval[f"synthetic/{k}"] for k in cli if "/r@" in k} == {k: v for k, v in cli.items() if "/r@" in k}
    for t in tasks:
        cli = command("zeroshot", world / "zeroshot" / t, f"z-{t}")
        for k in ("acc1", "mean_per_class_recall"):
            assert beyond[f"zeroshot/{t}/{k}"] == cli[f"zeroshot/{k}"], (t, k)
    cli = command("compositional", world / "compositional", "c")
    assert {k: v for k, v in beyond.items() if k.startswith("compositional/")} == \
        {k: v for k, v in cli.items() if k != "compositional/pairs"}
    assert len([k for k in beyond if k.startswith("compositional/")]) == 8  # seven categories and the mean
