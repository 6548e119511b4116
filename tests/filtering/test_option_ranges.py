"""Detector option ranges are declared once on the class (``OPTION_RANGES``) and checked by the dry run
(:func:`check_spec`) and the build alike (issue 41): vLLM's gpu_memory_utilization, tensor_parallel_size,
max_pixels, top_logprobs... out of range are one line naming the option and the interval."""

from __future__ import annotations

import math

import pytest

from halsift.filtering.detectors.spec import SpecError, check_spec, in_interval, load_detector, option_ranges
from halsift.launch.cli import main

BAD = ["gpu_memory_utilization=7", "gpu_memory_utilization=0", "gpu_memory_utilization=-0.5",
       "gpu_memory_utilization=1.0001", "tensor_parallel_size=0", "tensor_parallel_size=-2", "max_pixels=-5",
       "max_pixels=-1", "top_logprobs=-1", "top_logprobs=1", "max_new_tokens=0", "max_model_len=0"]
GOOD = ["gpu_memory_utilization=1", "gpu_memory_utilization=0.05", "tensor_parallel_size=1", "max_pixels=0",
        "max_pixels=200000", "top_logprobs=2", "max_new_tokens=1", "max_model_len=4096"]


@pytest.mark.parametrize("opt", BAD)
def test_out_of_range_vllm_options_fail_the_dry_run_check(opt):
    name = opt.split("=")[0]
    with pytest.raises(SpecError, match=rf"{name}: expected a value in [\[(].*, got "):
        check_spec(f"vllm:model=m,{opt}")


@pytest.mark.parametrize("opt", GOOD)
def test_in_range_vllm_options_pass(opt):
    check_spec(f"vllm:model=m,{opt}")


def test_the_build_checks_the_same_ranges_before_loading_anything():
    with pytest.raises(SpecError, match=r"gpu_memory_utilization: expected a value in \(0, 1\], got 7"):
        load_detector("vllm:model=/nonexistent,gpu_memory_utilization=7")


@pytest.mark.parametrize("opt", ["gpu_memory_utilization=7", "tensor_parallel_size=0", "max_pixels=-5",
                                 "top_logprobs=-1"])
def test_recipe_dry_run_refuses_out_of_range_options(tmp_path, capsys, monkeypatch, opt):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "quickstart", "--dry-run", f"score.detectors.j=vllm:model=m,{opt}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "score.detectors.j" in err[0] and opt.split("=")[0] in err[0], err


def test_ranges_are_declared_on_the_class():
    r = option_ranges("vllm")
    assert r["gpu_memory_utilization"] == "(0, 1]" and r["tensor_parallel_size"] == "[1, inf)"
    assert option_ranges("oracle") == {}


def test_in_interval():
    assert in_interval(1, "(0, 1]") and not in_interval(0, "(0, 1]") and in_interval(0, "[0, 1)")
    assert not in_interval(1, "[0, 1)") and in_interval(10 ** 9, "[1, inf)") and not in_interval(math.nan, "[0, inf)")
    assert in_interval(-3, "[-5, -1]") and not in_interval(-0.5, "[-5, -1]")
    with pytest.raises(ValueError, match="not an interval"):
        in_interval(1, "0..1")
