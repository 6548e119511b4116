"""One image transform's results kept by image, for the models of one eval stage (:class:`PreprocessMemo`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from halsift.corpus.memo import BudgetedMemo


class PreprocessMemo:
    """An image transform that also keeps each image's result by key (its file): the models of one eval stage share
    one architecture's transform, so each evaluation set is read, decoded and transformed once, not once per model.
    Called on an image it is the transform; :func:`preprocessed` asks it by key. Keeps results while they fit
    ``budget`` bytes (then transforms anew)."""

    def __init__(self, preprocess: Callable, budget: int = 1 << 30) -> None:
        self.preprocess, self.memo = preprocess, BudgetedMemo(budget)

    def __call__(self, image):
        return self.preprocess(image)

    def of(self, key: Any, load: Callable[[], Any]):
        return self.memo.get(key, lambda: self.preprocess(load()))

    def same_transform(self, preprocess: Callable) -> bool:
        """Whether ``preprocess`` (another checkpoint's) is this memo's transform (torchvision's ``repr`` lists each
        step with its settings)."""
        return repr(preprocess) == repr(self.preprocess)


def preprocessed(preprocess: Callable, key: Any, load: Callable[[], Any]):
    """``preprocess(load())``, or a :class:`PreprocessMemo`'s kept result for ``key``."""
    of = getattr(preprocess, "of", None)
    return of(key, load) if of is not None else preprocess(load())


__all__ = ["PreprocessMemo", "preprocessed"]
