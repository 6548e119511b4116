"""Shared fixtures: one small synthetic world per test session (built by `halsift synth`'s library call)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def synth_world(tmp_path_factory):
    """A small synthetic world (corpus/, bench/, retrieval/, pretrain/) shared by all tests; do not modify it."""
    from halsift.corpus.synth.world import generate_world

    out = tmp_path_factory.mktemp("world")
    generate_world(out, images=160, seed=0)
    return out
