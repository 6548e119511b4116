"""The detectors stage trains several detectors at once, each in its own spawned process, where the machine allows
(``plan_jobs``; ``detector_jobs`` forces it): the adapters are the ones the sequential stage writes (seeded), on CPU
with tiny settings (marked slow: run with --runslow)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from halsift.corpus.config import ConfigError, from_dict
from halsift.launch.recipe_config import Recipe
from halsift.launch.stages import detectors as stage
from halsift.launch.stages.base import Paths
from lora_data import small_bench

CLIP = "clip:arch=halsift-tiny,pretrained=random,seed=1"


def test_plan_jobs():
    assert stage.plan_jobs(2, cores=2, gpus=0) == 1  # this machine: one after another
    assert stage.plan_jobs(2, cores=16, gpus=0) == 2 and stage.plan_jobs(5, cores=12, gpus=0) == 3
    assert stage.plan_jobs(3, cores=16, gpus=1) == 1  # one GPU: in turn
    assert stage.plan_jobs(3, cores=16, gpus=2) == 2 and stage.plan_jobs(1, cores=64, gpus=8) == 1
    assert stage.plan_jobs(2, cores=2, gpus=0, jobs=4) == 2 and stage.plan_jobs(3, cores=64, gpus=0, jobs=1) == 1


def _recipe(run, jobs: int) -> Recipe:
    opts = dict(steps=2, batch_size=4, eval_every=2, warmup=0, max_val_rows=4)
    return from_dict(Recipe, {"run_dir": str(run), "device": "cpu", "detector_jobs": jobs,
                              "wandb": {"mode": "disabled"},
                              "detectors": {"a": {"kind": "lora", "base": CLIP, "options": {**opts, "lr": 0.05}},
                                            "b": {"kind": "lora", "base": CLIP, "options": {**opts, "lr": 0.01,
                                                                                              "seed": 3}}}})


@pytest.mark.slow  # ~35 s on 2 idle cores (two spawned processes import torch and train), over a minute when loaded
def test_concurrent_training_writes_the_sequential_adapters(synth_world, tmp_path, monkeypatch, capsys):
    bench = small_bench(synth_world, tmp_path / "bench", {"train": 8, "val": 4, "test": 2})
    monkeypatch.setattr(stage, "_cores", lambda: 2)
    out = {}
    for jobs in (1, 2):
        run = tmp_path / f"run{jobs}"
        p = Paths(run, "", str(bench), {}, "", "")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the thread count each of the 2 concurrent processes gets on 2 cores
        try:
            info = stage.stage_detectors(_recipe(run, jobs), p)
        finally:
            torch.set_num_threads(threads)
        assert info["trained"] == {n: f"lora:{run / 'detectors' / n / 'adapter'}" for n in ("a", "b")}
        out[jobs] = {n: {f: load_file(str(run / "detectors" / n / "adapter" / f))
                         for f in ("adapter_model.safetensors", "head.safetensors")} for n in ("a", "b")}
    assert "detectors: 2 trained 2 at a time (1 thread(s) each)" in capsys.readouterr().out
    for n in ("a", "b"):
        for f, tensors in out[1][n].items():
            assert tensors.keys() == out[2][n][f].keys()
            assert all(torch.equal(tensors[k], out[2][n][f][k]) for k in tensors), (n, f)
    a, b = out[1]["a"]["adapter_model.safetensors"], out[1]["b"]["adapter_model.safetensors"]
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the two detectors differ: the comparison can fail


def test_detector_jobs_must_not_be_negative(tmp_path):
    with pytest.raises(ConfigError, match=r"detector_jobs: expected a value in \[0, inf\), got -1"):
        from_dict(Recipe, {"run_dir": str(tmp_path), "detector_jobs": -1})
