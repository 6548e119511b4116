"""A judge that says when it is built: each construction appends this process's pid to the file
``$COUNTING_JUDGE_LOG`` names (tests count how often a process loads its judge; an environment variable, not an
option, because a file a spec names is part of the detector's fingerprint). Scores as ``random`` does, ``delay``
seconds per batch."""

from __future__ import annotations

import os

from halsift.filtering.detectors.baselines import RandomDetector


class CountingJudge(RandomDetector):
    """Options: ``seed``, ``delay`` (as ``random``'s)."""

    family = "counting"
    OPTION_HELP = {"seed": "as random's", "delay": "seconds to sleep per batch"}

    def __init__(self, seed: int = 0, delay: float = 0.0) -> None:
        super().__init__(seed=seed, delay=delay)
        with open(os.environ["COUNTING_JUDGE_LOG"], "a") as f:
            f.write(f"{os.getpid()}\n")
