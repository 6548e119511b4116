"""Bounds every comparison needs: ``random`` (seeded, lower bound) and ``oracle`` (ground truth, upper bound)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

from halsift.filtering.detectors.base import Detector, DetectorError, Item, Result


def hash_uniform(seed: int, key: str, sentence_index: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, key, sentence_index): independent of batch and rank order."""
    h = hashlib.blake2b(f"{seed}\x00{key}\x00{sentence_index}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


class RandomDetector(Detector):
    """Uniform scores in [0, 100), a deterministic function of (seed, key, sentence_index)."""

    family = "random"
    needs_image = False

    # one line of help per spec option (docs/config.md, --describe); a test keeps it in step with __init__
    OPTION_HELP = {
        "seed": "scores are a hash of (key, sentence index, seed): the same for every run and batch",
        "delay": "seconds to sleep per batch (interruption tests only)",
    }

    # the options' ranges, declared once: the dry run (check_spec), --describe and the build check them
    OPTION_RANGES = {"seed": "[0, inf)", "delay": "[0, inf)"}

    def __init__(self, seed: int = 0, delay: float = 0.0) -> None:
        super().__init__()
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed={seed!r}: expected an integer")
        self.seed = seed
        self.delay = float(delay)  # seconds per batch; for interruption tests only

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        if self.delay:
            time.sleep(self.delay)
        return [Result(100.0 * hash_uniform(self.seed, it.key, it.sentence_index)) for it in items]


ORACLE_SCORES = {"correct": 100.0, "incorrect": 0.0, "unknown": 50.0}


class OracleDetector(Detector):
    """Ground truth as a score: 100 correct, 0 incorrect, 50 unknown. Errors on items without a label."""

    family = "oracle"
    needs_image = False

    def __init__(self) -> None:
        super().__init__()

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        out = []
        for it in items:
            label = it.meta.get("label")
            if label not in ORACLE_SCORES:
                raise DetectorError(
                    f"oracle: item {it.key} sentence {it.sentence_index} has no ground-truth label "
                    f"(meta 'label' is {label!r}, expected one of {list(ORACLE_SCORES)}); the oracle needs "
                    "synthetic or annotated data")
            out.append(Result(ORACLE_SCORES[label]))
        return out
