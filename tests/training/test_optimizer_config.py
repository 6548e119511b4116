"""One optimizer section for every trainer (issue 40): each trainer's config takes its optimizer fields from
training/optimizer_config.py with its own defaults and YAML keys, and builds AdamW and the schedule there."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from halsift.synth.world_judge_config import WorldJudgeSettings
from halsift.training.caption_pretrain import CaptionPretrainConfig
from halsift.training.clip_config import ClipTrainConfig
from halsift.training.detector_config import DetectorTrainConfig
from halsift.training.optimizer_config import FIELDS, OptimizerSettings

# (config, its required fields, the optimizer keys and defaults it offers, AdamW's settings it fixes, schedule)
TRAINERS = [
    (ClipTrainConfig, {"data": ["x"], "out": "o"},
     {"lr": 5e-5, "wd": 0.1, "beta1": 0.9, "beta2": 0.98, "eps": 1e-6, "warmup": 10}, {}, "cosine"),
    (DetectorTrainConfig, {"base": "clip:arch=x", "bench": "b", "out": "o"},
     {"lr": 1e-3, "wd": 0.0, "warmup": 10}, {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}, "cosine"),
    (CaptionPretrainConfig, {"model": "m", "shards": "s", "out": "o", "save_to": "t"},
     {"lr": 2e-3, "warmup": 20}, {"wd": 0.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}, "linear_floor"),
]


def _factor(schedule: str, warmup: int, steps: int, s: int) -> float:
    """The schedules written out from their definitions (engine.cosine_with_warmup; caption pre-training's)."""
    if schedule == "cosine":
        if s < warmup:
            return (s + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, steps - warmup))))
    return min(1.0, (s + 1) / max(1, warmup)) * max(0.05, 1 - s / steps)


@pytest.mark.parametrize("cls, required, offered, fixed, schedule", TRAINERS, ids=lambda x: getattr(x, "__name__", ""))
def test_each_trainer_offers_its_fields_and_builds_what_they_say(cls, required, offered, fixed, schedule):
    assert issubclass(cls, OptimizerSettings)
    names = {f.name for f in dataclasses.fields(cls)}
    assert {k for k in FIELDS if k in names} == set(offered), "the YAML keys of the trainer's optimizer fields"
    cfg = cls(**required)
    assert {k: getattr(cfg, k) for k in offered} == offered, "the trainer's defaults"
    cfg = cls(**required, lr=0.5, warmup=3)
    cfg.validate()
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt, sched = cfg.build_optimizer(params, steps=11)
    group = opt.param_groups[0]
    want = {**fixed, **{k: v for k, v in offered.items() if k not in ("lr", "warmup")}}
    assert group["betas"] == (want["beta1"], want["beta2"]) and group["eps"] == want["eps"]
    assert group["weight_decay"] == want["wd"]
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.5 * _factor(schedule, 3, 11, s) for s in range(11)])


@pytest.mark.parametrize("cls, required, offered, fixed, schedule", TRAINERS, ids=lambda x: getattr(x, "__name__", ""))
def test_a_bad_optimizer_value_is_refused_naming_the_field(cls, required, offered, fixed, schedule):
    with pytest.raises(ValueError, match=r"^lr: expected a value in \[0, inf\), got -1"):
        cls(**required, lr=-1.0).validate()
    with pytest.raises(ValueError, match=r"^lr: expected a finite value in \[0, inf\), got nan"):
        cls(**required, lr=float("nan")).validate()
    if "beta2" in offered:
        with pytest.raises(ValueError, match=r"^beta2: expected a value in \[0, 1\), got 1.0"):
            cls(**required, beta2=1.0).validate()
    if "eps" in offered:
        with pytest.raises(ValueError, match=r"^eps: expected a finite value in \(0, inf\), got inf"):
            cls(**required, eps=float("inf")).validate()


def test_the_world_judge_lrs_are_optimizer_fields_with_their_defaults():
    s = WorldJudgeSettings()
    assert (s.pretrain_lr, s.judge_lr) == (2e-3, 5e-4)
    types = {f.name: f.type for f in dataclasses.fields(WorldJudgeSettings)}
    assert types["pretrain_lr"] in (float, "float") and types["judge_lr"] in (float, "float")


def test_cpu_training_steps_all_tensors_at_once_with_the_per_tensor_loops_weights():
    """On CPU every trainer's AdamW takes its multi-tensor (foreach) path, which torch leaves off there by default:
    after 20 steps of the tiny CLIP's parameter shapes with weight decay, the weights equal the per-tensor loop's
    bit for bit (so switching changed no trained model)."""
    cfg = ClipTrainConfig(data=["x"], out="o", lr=1e-3)

    def trained(foreach: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s)) for s in ((64, 32), (32,), (128, 64), (1,), (16, 3, 4, 4))]
        groups = [{"params": params[1::2], "weight_decay": 0.0}, {"params": params[0::2], "weight_decay": 0.1}]
        opt, sched = cfg.build_optimizer(groups, 20)
        assert all(group["foreach"] is True for group in opt.param_groups)
        for group in opt.param_groups:  # torch's CPU default
            group["foreach"] = foreach
        g = torch.Generator().manual_seed(1)
        for _ in range(20):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
            sched.step()
        return [p.detach() for p in params]

    built, loop = trained(True), trained(False)
    assert all(torch.equal(a, b) for a, b in zip(built, loop))
