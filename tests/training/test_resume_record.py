"""Issue 51, rule 4 (cause 7 and a risk): ``--resume`` trusts no absent record. Every checkpoint's ``state.json``
records the settings that decide what is trained, so a resume is checked against them with or without
``config.json`` (and against both when both are there); checkpoints that nothing ties to their settings are
refused; a resume below its newest checkpoint's step is refused, and one at it says that nothing is left to train."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_cases import _err_line

from halsift.training import engine

sys.path.insert(0, str(Path(__file__).parent))
from test_train_engine import ToyConfig, ToyTask, _killed_after_checkpoint  # noqa: E402


@pytest.fixture()
def killed(tmp_path, monkeypatch) -> Path:
    """A toy run killed right after its step-4 checkpoint (of 6 steps)."""
    out = tmp_path / "r"
    with _killed_after_checkpoint(monkeypatch, 4), pytest.raises(KeyboardInterrupt, match="simulated kill"):
        engine.run(ToyTask(ToyConfig(out=str(out))))
    return out


def _newest_state(out: Path) -> dict:
    return json.loads((engine.complete_checkpoints(out)[-1] / "state.json").read_text())


def test_every_checkpoint_records_the_settings_that_decide_what_is_trained(killed):
    settings = _newest_state(killed)["settings"]
    assert settings["lr"] == 0.1 and settings["grad_clip"] == 1.0
    assert not set(settings) & engine.RESUME_MAY_CHANGE  # steps, seed, logging ... may change on resume


@pytest.mark.parametrize("change, key", [({"lr": 0.2}, "lr"), ({"grad_clip": 0.0}, "grad_clip")])
def test_without_config_json_the_checkpoint_refuses_another_run(killed, change, key):
    (killed / "config.json").unlink()  # the probe: delete it, resume with another learning rate
    with pytest.raises(engine.ResumeMismatch, match=rf"^--resume: .*holds a training run with a different {key} "):
        engine.run(ToyTask(ToyConfig(out=str(killed), resume=True, **change)))
    assert not (killed / "config.json").exists()  # refused before anything was written


def test_without_config_json_the_same_run_resumes_exactly(killed, tmp_path):
    straight = engine.run(ToyTask(ToyConfig(out=str(tmp_path / "straight"))))
    (killed / "config.json").unlink()
    resumed = engine.run(ToyTask(ToyConfig(out=str(killed), resume=True)))
    assert resumed["step"] == 6 and resumed["weight"].equal(straight["weight"])


def test_an_edited_config_json_does_not_outvote_the_checkpoint(killed):
    record = json.loads((killed / "config.json").read_text())
    (killed / "config.json").write_text(json.dumps({**record, "lr": 0.2}))  # made to agree with the new run
    with pytest.raises(engine.ResumeMismatch, match=r"different lr \(0\.1 vs 0\.2\)"):
        engine.run(ToyTask(ToyConfig(out=str(killed), resume=True, lr=0.2)))


def test_checkpoints_that_nothing_ties_to_their_settings_are_refused(killed):
    (killed / "config.json").unlink()
    for ckpt in engine.complete_checkpoints(killed):  # checkpoints written before they recorded their settings
        state = json.loads((ckpt / "state.json").read_text())
        del state["settings"]
        (ckpt / "state.json").write_text(json.dumps(state))
    with pytest.raises(engine.ResumeMismatch, match=r"^--resume: .* holds checkpoints \(newest step_000004\) but no "
                                                    r"record of the settings that made them"):
        engine.run(ToyTask(ToyConfig(out=str(killed), resume=True)))


def test_a_resume_below_its_checkpoint_is_refused_and_one_at_it_says_so(killed, capsys):
    before = (killed / "config.json").read_text()
    with pytest.raises(engine.ResumeMismatch, match=r"step_000004 is at step 4, past --steps 2: a resumed run "
                                                    r"cannot train fewer steps"):
        engine.run(ToyTask(ToyConfig(out=str(killed), resume=True, steps=2)))
    assert (killed / "config.json").read_text() == before
    assert engine.run(ToyTask(ToyConfig(out=str(killed), resume=True, steps=4)))["step"] == 4
    assert "is at step 4 = --steps: nothing left to train" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ the probe, from the CLI
@pytest.fixture(scope="module")
def clip_run(tmp_path_factory):
    from filtering_data import make_corpus

    from halsift.launch.cli import main

    root = tmp_path_factory.mktemp("resume")
    data = make_corpus(root / "c", shards=1, per_shard=8)
    args = ["train", "clip", "--data", str(data), "--model", "halsift-tiny", "--batch-size", "4", "--workers", "0",
            "--wandb-mode", "disabled", "--checkpoint-every", "2", "--lr", "1e-3"]
    assert main([*args, "--out", str(root / "run"), "--steps", "4"]) == 0
    return root, args


def test_train_clip_resume_without_config_json_and_another_lr_is_one_line(clip_run, tmp_path, capsys):
    import shutil

    from halsift.launch.cli import main

    root, args = clip_run
    out = tmp_path / "run"
    shutil.copytree(root / "run", out)
    (out / "config.json").unlink()
    assert main([*args, "--out", str(out), "--steps", "6", "--resume", "--lr", "5e-3"]) == 2
    line = _err_line(capsys)
    assert line.startswith("halsift train clip: error: --resume: ") and "different lr" in line, line


def test_train_clip_resume_with_fewer_steps_is_one_line(clip_run, capsys):
    from halsift.launch.cli import main

    root, args = clip_run
    assert main([*args, "--out", str(root / "run"), "--steps", "2", "--resume"]) == 2
    assert "is at step 4, past --steps 2" in _err_line(capsys)
