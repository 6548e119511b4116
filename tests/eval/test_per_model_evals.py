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


def test_each_image_is_read_and_transformed_once_for_every_model(world_and_weights, tmp_path, monkeypatch):
    """Two checkpoints (one twice) evaluated together: every set's images are decoded once, not once per checkpoint,
    and each checkpoint's numbers are those it gets evaluated alone."""
    import torch
    from safetensors.torch import save_model

    import halsift.corpus.classification as classification
    import halsift.corpus.images as images
    from halsift.eval.registry import per_model_evals
    from halsift.eval.runs.per_model import evaluate_models
    from halsift.filtering.models.clip_models import load_open_clip

    world, weights = world_and_weights
    torch.manual_seed(1)
    other = str(tmp_path / "other.safetensors")
    save_model(load_open_clip("halsift-tiny", None)[0], other)
    tasks = sorted(d.name for d in (world / "zeroshot").iterdir() if d.is_dir())
    sets = {"retrieval": {"synthetic": str(world / "retrieval")},
            "zeroshot": {t: str(world / "zeroshot" / t) for t in tasks},
            "compositional": {"compositional": str(world / "compositional")}}
    def out(name: str):
        (tmp_path / name).mkdir()
        return tmp_path / name

    alone = {w: evaluate_models({"m": [w]}, "halsift-tiny", per_model_evals(), sets, out(f"alone{i}"), "cpu", 16,
                                "fp32") for i, w in enumerate((weights, other))}
    reads = []
    real_file, real_open = images.load_image_file, classification.open_image
    monkeypatch.setattr(images, "load_image_file", lambda p, *a, **k: reads.append(p) or real_file(p, *a, **k))
    monkeypatch.setattr(classification, "open_image", lambda *a, **k: reads.append(a) or real_open(*a, **k))
    together = evaluate_models({"a": [weights, other], "b": [weights]}, "halsift-tiny", per_model_evals(), sets,
                               out("together"), "cpu", 16, "fp32")
    once = len(reads)
    assert once and len({str(r) for r in reads}) == once  # no image read twice over three checkpoints
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # noqa: E731 (NaN == NaN)
    for file in ("retrieval.json", "beyond.json"):
        assert same(together[file]["a"], [alone[weights][file]["m"][0], alone[other][file]["m"][0]])
        assert same(together[file]["b"], alone[weights][file]["m"])
