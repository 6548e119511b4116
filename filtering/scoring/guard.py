"""What a score run refuses to write or to call complete: the checks on a detector's results, in one place.

* A non-finite score (NaN, inf: e.g. a checkpoint with NaN weights) is never written: the run stops at the first
  one, with one line naming the detector and the item, before its part is written.
* A parse-failure rate (results with ``parsed`` false: a judge's reply that no score could be read from, scored
  50) above ``max_parse_failures`` stops the run: checked as results come, once ``MIN_CHECKED`` items were
  scored in this process (one early failure does not stop a run), and over the whole folder at the end.
* A run that scored nothing (every sample skipped) is not complete: one line with the skip counts by kind.

:class:`ScoreGuard` checks results batch by batch (:class:`halsift.filtering.scoring.parts.PartRows` calls it);
:func:`final_check` checks a finished folder's totals (``parts.finish_manifest``). Both raise
:class:`ScoreError`, an input error: the CLI prints its one line and exits 2. A folder that fails the final check
gets ``status: failed`` and the ``error`` in its manifest, so ``select`` refuses it; its parts are kept, so a rerun
with another ``max_parse_failures`` finishes without rescoring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from halsift.corpus.errors import InputError

DEFAULT_MAX_PARSE_FAILURES = 0.2
MIN_CHECKED = 200  # items scored (in one process) before the parse-failure rate may stop a run mid-way


class ScoreError(InputError):
    """A score run that must not go on or be called complete (non-finite scores, too many parse failures,
    nothing scored); one line."""


def check_rate(value: float, what: str = "max_parse_failures") -> float:
    """``value`` as a fraction in [0, 1], or a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{what}: expected a fraction between 0 and 1, got {value!r}")
    return float(value)


def _rate_error(detector: str, failures: int, n: int, limit: float, where: str) -> ScoreError:
    return ScoreError(f"detector {detector}: {failures} of {n} items ({100 * failures / n:.1f}%) {where} got no "
                      f"parsable answer (max_parse_failures {limit:g}); check the model or server and its replies, "
                      "or raise --max-parse-failures")


class ScoreGuard:
    """Checks a process's results as they come (see the module docstring); one per scoring process."""

    def __init__(self, detector: str, max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES,
                 min_checked: int = MIN_CHECKED) -> None:
        self.detector = detector
        self.max_parse_failures = check_rate(max_parse_failures)
        self.min_checked = int(min_checked)
        self.items = 0
        self.failures = 0

    def check(self, rows: Sequence[tuple[str, int, str]], scores: Sequence[float], parsed: Sequence[bool]) -> None:
        """``rows``: (key, sentence_index, captioner) per item; raises :class:`ScoreError` on a non-finite score or,
        past ``min_checked`` items, a parse-failure rate above the limit."""
        for (key, index, _), s in zip(rows, scores):
            if not math.isfinite(s):
                raise ScoreError(f"detector {self.detector}: non-finite score {s} for key {key!r} sentence {index} "
                                 "(NaN or inf in the model's weights or outputs?); nothing of this part was written")
        self.items += len(scores)
        self.failures += sum(not p for p in parsed)
        if self.items >= self.min_checked and self.failures > self.max_parse_failures * self.items:
            raise _rate_error(self.detector, self.failures, self.items, self.max_parse_failures, "scored so far")


def final_check(detector: str, sentences: int, parse_failures: int, skipped: dict,
                max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES) -> str | None:
    """The error line of a finished folder that must not be called complete, else None: nothing scored (with the
    skip counts by kind), or a parse-failure rate above ``max_parse_failures`` over all its items."""
    if sentences == 0:
        from halsift.corpus.sample import nothing_read

        return nothing_read(0, skipped, "score")
    if parse_failures > check_rate(max_parse_failures) * sentences:
        return str(_rate_error(detector, parse_failures, sentences, max_parse_failures, "in the folder"))
    return None


__all__ = ["DEFAULT_MAX_PARSE_FAILURES", "MIN_CHECKED", "ScoreError", "ScoreGuard", "check_rate", "final_check"]
