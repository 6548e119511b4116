"""Fine-tuning seed noise in the compare report: the measured seed spread the one-seed answer states, and the
per-seed R@k values of the table and of the page's dot plots."""

from __future__ import annotations

import math
from collections.abc import Sequence

# The std of one filter's R@5 between fine-tuning seeds on the quickstart's world, in points: 0.92 pooled over 35
# pairs of seeds (7 fine-tuned filters x worlds 21-25, two seeds each; docs/table_f.md, "Seed spread"), 0.88 over the
# 4 pairs whose per-seed values docs/cascade.md lists (judge and cascade-25, worlds 21 and 22).
SEED_SD = 0.9
Z95 = 1.96


def seed_caveat(n_seeds: int, k: int = 5) -> str:
    """The answer's sentence when an interval covers evaluation sampling only: the training noise it leaves out,
    with its measured size (:data:`SEED_SD`, a difference of two filters: sqrt(2) of it)."""
    why = "one fine-tuning seed" if n_seeds < 2 else "one fine-tuning seed for a model it is compared with"
    return (f"With {why}, these intervals cover evaluation sampling only: between fine-tuning seeds one filter's "
            f"R@5 moves by {SEED_SD:.1f} points (std) on the quickstart's world (docs/table_f.md, \"Seed spread\"), "
            f"about ±{Z95 * math.sqrt(2) * SEED_SD:.1f} points at 95% on the difference of two filters, which they "
            "leave out; two or more seeds (`finetune.seeds`) put it in the interval"
            + ("" if k == 5 else f" (measured for R@5; R@{k} was not measured)") + ".")


def per_seed_text(values: Sequence[float]) -> str:
    """A table cell: each fine-tuning seed's value, in seed order ("–" where none)."""
    shown = [f"{v:.1f}" if math.isfinite(v) else "–" for v in values]
    return ", ".join(shown) if shown else "–"


def seed_dots(per_row: Sequence[Sequence[float]], width: float = 100.0, pad: float = 4.0) -> list[dict | None]:
    """For the page's dot plots, one per table row on a scale shared by all rows: ``{"xs": [x per seed], "mean":
    x of their mean, "label": text}`` (x in pixels, 0..width), or None for a row without a finite value."""
    finite = [v for vals in per_row for v in vals if math.isfinite(v)]
    if not finite:
        return [None] * len(per_row)
    lo, hi = min(finite), max(finite)
    span = hi - lo

    def x(v: float) -> float:
        return round(pad + (width - 2 * pad) * ((v - lo) / span if span > 0 else 0.5), 1)

    out: list[dict | None] = []
    for vals in per_row:
        vals = [v for v in vals if math.isfinite(v)]
        out.append({"xs": [x(v) for v in vals], "mean": x(sum(vals) / len(vals)),
                    "label": f"per seed: {per_seed_text(vals)} (axis {lo:.1f} to {hi:.1f})"} if vals else None)
    return out
