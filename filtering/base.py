"""The detector interface: an :class:`Item` (one sentence of one caption with its image) in, a :class:`Result`
(0–100 score, higher = more likely correct) out, in batches.

Every detector family (``clip``, ``random``, ``oracle``, ``ensemble``; later ``vlm``, ``api``, ``lora``)
subclasses :class:`Detector` and is built from a spec string by :func:`halsift.filtering.spec.load_detector`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

CAPTION_INDEX = -1  # ``sentence_index`` of a whole-caption score (``unit="caption"``)


@dataclass
class Item:
    """One thing to score: a sentence of a caption, with the caption's preceding sentences and its image."""

    key: str  # sample key (shards) or row id (bench)
    sentence_index: int  # position of the sentence in its caption; CAPTION_INDEX for a whole caption
    sentence: str
    context: list[str] = field(default_factory=list)  # the caption's sentences before this one
    image: Any = None  # a PIL image (RGB), or None for text-only detectors
    image_id: str = ""  # items with the same image_id (and key) share one image
    meta: dict = field(default_factory=dict)  # captioner, source, ground truth ("label", "types", "spans")


@dataclass
class Result:
    """A detector's verdict on one item."""

    score: float  # 0–100, higher = more likely correct
    parsed: bool = True  # False where the raw output could not be parsed and the score fell back to 50
    spans: list[list[int]] | None = None  # [start_word, end_word) of hallucinated segments, if localized


class DetectorError(ValueError):
    """A detector cannot score the given items (e.g. ``oracle`` without ground-truth labels)."""


class Detector:
    """Base class. Subclasses set ``family`` and implement :meth:`score_batch`.

    ``spec`` is the canonical spec string (what the score manifest records and compares on resume);
    ``name`` goes into the ``detector`` column of score tables.
    """

    family: ClassVar[str] = ""
    localizes: ClassVar[bool] = False  # True if results carry ``spans``
    needs_image: ClassVar[bool] = True

    def __init__(self, spec: str = "") -> None:
        self.spec = spec or self.family

    @property
    def name(self) -> str:
        return self.spec

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        """Score ``items`` (one result per item, same order)."""
        raise NotImplementedError

    def prepare(self, items: Sequence[Item]) -> Any:
        """The CPU half of scoring ``items`` (image preprocessing, tokenization), for the runner's read-ahead
        thread; ``None`` (the default) when the detector has no such half. Must not touch the model."""
        return None

    def score_prepared(self, items: Sequence[Item], prepared: Any) -> list[Result]:
        """Score ``items`` from their :meth:`prepare` output; the same results as :meth:`score_batch`."""
        return self.score_batch(items)

    def to(self, device: Any) -> "Detector":
        """Move to ``device`` (no-op for detectors without a model)."""
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"
