"""A detector family registered for one test (or module) only: a family left in the registry would reach every later
test of the session (docs/config.md's reference lists every registered family)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from halsift.filtering.detectors.baselines import OracleDetector


@contextmanager
def registered(name: str, cls: type) -> Iterator[None]:
    """``cls`` as detector family ``name`` while the block runs; removed (and its cached config) afterwards."""
    from halsift.filtering.detectors import spec as spec_module

    spec_module.register_family(name, cls)
    try:
        yield
    finally:
        spec_module._REGISTRY.pop(name, None)
        for key in [k for k in spec_module._CONFIGS if k[0] == name]:
            del spec_module._CONFIGS[key]


def counting_oracle(family: str) -> type:
    """An oracle family that records every unit it is asked to score (``calls``: (key, sentence index))."""

    class CountingOracle(OracleDetector):
        calls: list[tuple[str, int]] = []

        def score_batch(self, items):
            CountingOracle.calls.extend((it.key, it.sentence_index) for it in items)
            return super().score_batch(items)

    CountingOracle.family = family
    return CountingOracle
