"""Results kept by key within a byte budget (:class:`BudgetedMemo`): an eval stage's transformed images, a detector
training run's processed train images. Light to import (no torch)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def nbytes(x: Any) -> int:
    """Bytes held by a tensor (or array with ``numel``/``element_size``), or by the tensors of a mapping; 0 else."""
    if isinstance(x, Mapping):
        return sum(nbytes(v) for v in x.values())
    if hasattr(x, "numel") and hasattr(x, "element_size"):
        return int(x.numel()) * int(x.element_size())
    return 0


class BudgetedMemo:
    """``make()``'s result kept by ``key`` while the kept results fit ``budget`` bytes (:func:`nbytes`); past it, a
    new key is made anew each time. Only for deterministic ``make`` whose results callers read, never change."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used = int(budget), 0
        self.kept: dict[Any, Any] = {}

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        x = self.kept.get(key)
        if x is None:
            x = make()
            size = nbytes(x)
            if self.used + size <= self.budget:
                self.kept[key], self.used = x, self.used + size
        return x


__all__ = ["BudgetedMemo", "nbytes"]
