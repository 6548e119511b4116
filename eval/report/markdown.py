"""Markdown helpers shared by every report: one number formatter and one table renderer."""

from __future__ import annotations

import math
from collections.abc import Sequence

NA = "n/a"


def fmt(v: float | None, digits: int = 3) -> str:
    """A number for a markdown cell; None/NaN -> 'n/a'."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return NA
    return f"{v:.{digits}f}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (GitHub layout) with one line per row."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
