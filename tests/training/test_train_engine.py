"""The training engine (`halsift.training.engine`): a toy task through the loop (log steps, gradient accumulation,
resume after an interrupted run equals a straight run, non-finite loss), old checkpoints refused clearly, and the
caption pre-training task resumed mid-run."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from halsift.training import engine


@dataclasses.dataclass
class ToyConfig:
    out: str
    steps: int = 6
    batch_size: int = 4
    lr: float = 0.1
    seed: int = 0
    resume: bool = False
    log_every: int = 2
    checkpoint_every: int = 2
    keep_checkpoints: int = 0
    grad_clip: float = 1.0
    wandb_project: str = "halsift"
    wandb_run: str = ""
    wandb_mode: str = "disabled"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class ToyTask(engine.Task):
    """Linear regression on random batches drawn per micro-batch from a seeded generator (replayed on resume)."""

    def __init__(self, cfg: ToyConfig, poison_at: int = 0) -> None:
        self.cfg, self.poison_at, self.calls = cfg, poison_at, 0

    def accelerator_kwargs(self) -> dict:
        return {"gradient_accumulation_steps": 2}

    def build(self, accelerator):
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=self.cfg.lr)
        return model, opt, engine.cosine_with_warmup(opt, 1, self.cfg.steps)

    def batches(self, start: int):
        gen = torch.Generator().manual_seed(self.cfg.seed)
        for i in range(self.cfg.steps * 2):
            x = torch.randn(self.cfg.batch_size, 3, generator=gen)
            if i >= start * 2:
                yield x, x.sum(-1, keepdim=True)

    def loss(self, model, batch) -> torch.Tensor:
        self.calls += 1
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        return loss * float("nan") if self.calls == self.poison_at else loss

    def finish(self, model, step: int) -> dict:
        return {"step": step, "weight": model.weight.detach().clone()}


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@contextlib.contextmanager
def _killed_after_checkpoint(monkeypatch, at: int):
    """Within the block, a run raises KeyboardInterrupt right after writing step ``at``'s checkpoint."""
    real = engine.save_checkpoint

    def save_then_die(acc, out, step, *args, **kw):
        path = real(acc, out, step, *args, **kw)
        if step == at:
            raise KeyboardInterrupt(f"simulated kill after step {at}'s checkpoint")
        return path

    with monkeypatch.context() as m:
        m.setattr(engine, "save_checkpoint", save_then_die)
        yield


def test_toy_task_logs_checkpoints_and_resumes_exactly(tmp_path, monkeypatch):
    straight = engine.run(ToyTask(ToyConfig(out=str(tmp_path / "a"))))
    a = _lines(tmp_path / "a")
    assert straight["step"] == 6 and [x["step"] for x in a] == [2, 4, 6]  # the loss is read at log steps only
    assert all("train/loss" in x and "train/lr" in x and x["train/samples_per_s"] > 0 for x in a)
    assert [p.name for p in engine.complete_checkpoints(tmp_path / "a")] == ["step_000002", "step_000004",
                                                                           "step_000006"]
    with _killed_after_checkpoint(monkeypatch, 4), pytest.raises(KeyboardInterrupt,
                                                                 match="^simulated kill after step 4's checkpoint$"):
        engine.run(ToyTask(ToyConfig(out=str(tmp_path / "b"))))
    resumed = engine.run(ToyTask(ToyConfig(out=str(tmp_path / "b"), resume=True)))
    assert torch.equal(resumed["weight"], straight["weight"])  # optimizer, scheduler and data position restored
    b = _lines(tmp_path / "b")  # lines after step 4 rewritten; the same losses and lrs
    assert [(x["step"], x["train/loss"], x["train/lr"]) for x in b] == \
        [(x["step"], x["train/loss"], x["train/lr"]) for x in a]


def test_resume_refuses_a_run_that_trains_something_else(tmp_path, monkeypatch):
    """--resume continues the run config.json records: a setting that decides what is trained is refused in one line
    naming it (an older record without the setting compares equal to its default only); more steps continue."""
    out = tmp_path / "r"
    with _killed_after_checkpoint(monkeypatch, 4), pytest.raises(KeyboardInterrupt, match="^simulated kill after"):
        engine.run(ToyTask(ToyConfig(out=str(out))))
    with pytest.raises(engine.ResumeMismatch, match=r"^--resume: .*/r: holds a training run with a different lr "
                                                    r"\(0\.1 vs 0\.2\); give it the recorded value"):
        engine.run(ToyTask(ToyConfig(out=str(out), resume=True, lr=0.2)))
    assert [p.name for p in engine.complete_checkpoints(out)] == ["step_000002", "step_000004"]  # nothing written
    record = json.loads((out / "config.json").read_text())
    del record["lr"]  # a record written before the setting existed
    (out / "config.json").write_text(json.dumps(record))
    with pytest.raises(engine.ResumeMismatch, match="different lr"):
        engine.run(ToyTask(ToyConfig(out=str(out), resume=True, lr=0.2)))
    assert engine.run(ToyTask(ToyConfig(out=str(out), resume=True, steps=8)))["step"] == 8


def test_nonfinite_loss_stops_with_the_step_and_an_event_line(tmp_path):
    out = tmp_path / "nan"
    with pytest.raises(engine.NonFiniteLossError, match=r"loss is nan at step 2; stopped without saving\. "
                                                        r"Last good checkpoint: none"):
        engine.run(ToyTask(ToyConfig(out=str(out), log_every=5), poison_at=4))  # step 2's second micro-batch
    assert _lines(out)[-1] == {"step": 2, "event": "nonfinite_loss", "train/loss": pytest.approx(float("nan"),
                                                                                                 nan_ok=True)}
    assert not engine.complete_checkpoints(out)


def test_checkpoint_of_the_old_layout_is_refused_clearly(tmp_path):
    from safetensors.torch import save_file

    old = tmp_path / "old" / "checkpoints" / "step_000002"
    old.mkdir(parents=True)
    save_file({"weight": torch.zeros(1, 3), "bias": torch.zeros(1)}, str(old / "model.safetensors"))
    torch.save({}, old / "optimizer.pt")
    (old / "state.json").write_text(json.dumps({"step": 2}))
    (old.parents[1] / "config.json").write_text(json.dumps(ToyConfig(out=str(tmp_path / "old")).to_dict()))
    with pytest.raises(FileNotFoundError, match="step_000002: no optimizer.bin .*new --out"):
        engine.run(ToyTask(ToyConfig(out=str(tmp_path / "old"), resume=True)))


def test_caption_pretraining_resumes_like_a_straight_run(synth_world, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from halsift.synth.tiny_vlm import build_tiny_vlm
    from halsift.training.caption_pretrain import CaptionPretrainConfig, pretrain_captioner

    base = build_tiny_vlm("llava", tmp_path / "base", seed=0)

    def cfg(name: str, **kw) -> CaptionPretrainConfig:
        return CaptionPretrainConfig(model=str(base), shards=str(synth_world / "pretrain"), out=str(tmp_path / name),
                                     save_to=str(tmp_path / f"{name}_model"), steps=4, batch_size=2, seed=3,
                                     log_every=1, checkpoint_every=2, **kw)

    straight = pretrain_captioner(cfg("a"), show_progress=False)
    assert straight["samples"] > 0 and straight["loss_first"] > 0
    with _killed_after_checkpoint(monkeypatch, 2), pytest.raises(KeyboardInterrupt,
                                                                 match="^simulated kill after step 2's checkpoint$"):
        pretrain_captioner(cfg("b"), show_progress=False)
    assert not (tmp_path / "b_model").exists()
    pretrain_captioner(cfg("b", resume=True), show_progress=False)
    la, lb = _lines(tmp_path / "a"), _lines(tmp_path / "b")
    assert [x["step"] for x in lb] == [1, 2, 3, 4]
    for x, y in zip(la, lb):
        assert y["train/loss"] == pytest.approx(x["train/loss"], rel=1e-5), x["step"]
    wa = load_file(str(tmp_path / "a_model" / "model.safetensors"))
    wb = load_file(str(tmp_path / "b_model" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
