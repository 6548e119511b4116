"""One scale for every percentage a user reads: 0–100, like the papers and the reports (DESIGN.md "Metrics").

Shares are computed as fractions (0–1) where that is natural and turned into percentages here, once per output:
the select manifest's precision, ``eval bench``'s precision, base rate, failure and incorrect rates, the reports."""

from __future__ import annotations

import math

SCALE = 100  # written as ``scale`` in a select manifest: its precision fields are percentages


def percent(share: float | None, ndigits: int | None = None) -> float | None:
    """``share`` (0–1) as a percentage (0–100), rounded to ``ndigits`` when given; ``None`` and NaN pass through."""
    if share is None:
        return None
    value = float(share) * SCALE
    return round(value, ndigits) if ndigits is not None and math.isfinite(value) else value
