"""Shared fixtures: one small synthetic world per test session (built by `halsift synth`'s library call)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _bind_transformers_log() -> None:
    """transformers binds its log handler to the ``sys.stderr`` of its first use. Bind it now, to the session's
    stream: first used inside a test, it would hold that test's capsys stream, closed afterwards, and every later
    transformers warning would print a "Logging error" traceback into another test's stderr."""
    try:
        from transformers.utils import logging
    except ImportError:
        return
    logging.get_logger()


_bind_transformers_log()


@pytest.fixture(scope="session")
def synth_world(tmp_path_factory):
    """A small synthetic world (corpus/, bench/, retrieval/, pretrain/) shared by all tests; do not modify it."""
    from halsift.synth.world import generate_world

    out = tmp_path_factory.mktemp("world")
    generate_world(out, images=160, seed=0)
    return out


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow (minutes each)")


def pytest_collection_modifyitems(config, items):
    """Plain `pytest` runs the CPU suite; `slow` tests need --runslow, `gpu` tests a CUDA device."""
    run_slow = config.getoption("--runslow")
    has_gpu = None
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with --runslow"))
        if "gpu" in item.keywords:
            if has_gpu is None:
                import torch

                has_gpu = torch.cuda.is_available()
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
