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


def lost_on_undo(target: object, name: str) -> bool:
    """Whether monkeypatch's undo would delete ``target.name`` instead of restoring it: from pytest 9.2 the undo of a
    ``setattr`` on an instance deletes a name that was neither in the instance's ``__dict__`` nor on its class — an
    attribute served by ``__getattr__``, such as a torch module's buffers, parameters and submodules."""
    if isinstance(target, (str, type)) or not hasattr(target, name):
        return False
    in_dict = isinstance(getattr(target, "__dict__", None), dict) and name in vars(target)
    return not in_dict and not hasattr(type(target), name)


class GuardedMonkeyPatch(pytest.MonkeyPatch):
    """pytest's monkeypatch, refusing a patch that its undo cannot put back (``lost_on_undo``): the object may be
    shared by a module- or session-scoped fixture, so later tests would see it damaged. Patch a copy instead."""

    def setattr(self, target, *args, **kwargs):  # noqa: D102 - pytest's signature
        if args and isinstance(args[0], str) and lost_on_undo(target, args[0]):
            raise AssertionError(f"monkeypatch.setattr({type(target).__name__}, {args[0]!r}): its undo would delete "
                                 "the attribute (served by __getattr__, e.g. a torch buffer); patch a copy")
        return super().setattr(target, *args, **kwargs)

    def delattr(self, target, *args, **kwargs):  # noqa: D102 - pytest's signature
        if args and isinstance(args[0], str) and lost_on_undo(target, args[0]):
            raise AssertionError(f"monkeypatch.delattr({type(target).__name__}, {args[0]!r}): its undo cannot "
                                 "restore the attribute; patch a copy")
        return super().delattr(target, *args, **kwargs)


@pytest.fixture
def monkeypatch():
    """The suite's monkeypatch: pytest's, guarded by :class:`GuardedMonkeyPatch`."""
    mp = GuardedMonkeyPatch()
    yield mp
    mp.undo()
