"""One scale for every percentage a user reads: 0–100, like the papers and the reports (DESIGN.md "Conventions").

Shares are computed as fractions (0–1) where that is natural and turned into percentages here, once per output:
the select manifest's precision, ``eval bench``'s precision, base rate, failure and incorrect rates, VOPE's rates,
VIGIL's F1, the reports. A file of percentages records ``"scale": 100`` (:func:`mark_percent`); one without it was
written by an earlier halsift and holds shares, which :func:`read_on_percent_scale` turns into percentages."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping

SCALE = 100  # written as ``scale`` in a select manifest and an eval's metrics.json: their shares are percentages
SCALE_KEY = "scale"


def percent(share: float | None, ndigits: int | None = None) -> float | None:
    """``share`` (0–1) as a percentage (0–100), rounded to ``ndigits`` when given; ``None`` and NaN pass through."""
    if share is None:
        return None
    value = float(share) * SCALE
    return round(value, ndigits) if ndigits is not None and math.isfinite(value) else value


def ratio_percent(part: float, whole: float) -> float:
    """``part`` of ``whole`` as a percentage (0–100): ``100 * part / whole``; NaN when ``whole`` is 0."""
    return SCALE * part / whole if whole else float("nan")


def mark_percent(metrics: Mapping) -> dict:
    """``metrics`` with ``"scale": 100``: the mark of a file whose shares are percentages."""
    return {**metrics, SCALE_KEY: SCALE}


def matches(key: str, patterns: Iterable[str]) -> bool:
    """Whether ``key`` matches one of the ``fnmatch`` ``patterns`` (``*`` spans ``/``)."""
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def read_on_percent_scale(metrics: Mapping, were_shares: Iterable[str], what: str) -> dict:
    """``metrics`` (a flat metrics.json) on the one scale: as it is when it records ``"scale": 100``; without
    ``scale`` (an earlier halsift) every number whose key matches a pattern of ``were_shares`` times 100, and
    ``scale`` set. Raises ``ValueError`` naming ``what`` for another ``scale``."""
    scale = metrics.get(SCALE_KEY, 1)
    if scale == SCALE and not isinstance(scale, bool):
        return dict(metrics)
    if scale != 1 or isinstance(scale, bool):
        raise ValueError(f"{what}: scale {scale!r}: expected {SCALE} (percentages) or none (shares, 0–1)")
    patterns = tuple(were_shares)
    out = {k: (percent(v) if _number(v) and matches(k, patterns) else v) for k, v in metrics.items()}
    return mark_percent(out)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
