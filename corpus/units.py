"""What a caption is scored and selected by, declared once for ``score``, ``select``, recipes and the notebook API:
the unit (each sentence against its image, or the whole caption) and how a whole caption's sentence scores are
aggregated when selecting whole captions."""

from __future__ import annotations

from typing import Literal, get_args

Unit = Literal["sentence", "caption"]
UNITS: tuple[str, ...] = get_args(Unit)
Agg = Literal["min", "mean", "prob", "prune", "repair"]
AGGS: tuple[str, ...] = get_args(Agg)


def check_unit(unit: object, where: str = "unit") -> None:
    """Raise ValueError naming ``where`` unless ``unit`` is one of :data:`UNITS`."""
    if unit not in UNITS:
        raise ValueError(f"{where}: expected one of {', '.join(UNITS)}, got {unit!r}")
