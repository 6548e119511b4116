"""The detector interface: an :class:`Item` (one sentence of one caption with its image) in, a :class:`Result`
(0–100 score, higher = more likely correct) out, in batches.

Every detector family (``clip``, ``random``, ``oracle``, ``ensemble``, ``vlm``, ``api``, ``lora``) subclasses
:class:`Detector`, is registered by name in :mod:`halsift.filtering.detectors.spec` (its registry, or ``register_family``)
and built from a spec string by :func:`halsift.filtering.detectors.spec.load_detector`.

Beyond ``score_batch``, what a detector can do is declared, never probed (:data:`CAPABILITIES`):

* ``set-level`` (:attr:`Detector.set_level`): its scores depend on the whole scored set; it has ``members`` and
  :meth:`Detector.combine_scores`, and the runner scores the members over the whole input, then combines once.
* ``localization`` (:attr:`Detector.localizes`): its results carry ``spans``.
* ``vlm-judge`` (:attr:`Detector.judge`): it lends a loaded VLM (:class:`~halsift.filtering.detectors.vlm_judge.VlmJudge`)
  for multiple-choice QA (I-HallA) and sentence likelihoods (``eval bench --likelihood``).
* ``staged`` (:attr:`Detector.staged`, a class constant): it is fitted on the whole corpus and runs as a staged job
  (``halsift score``), so a spec may hold it only at its top (:func:`~halsift.filtering.detectors.spec.check_tree`).

A caller that needs one asks :meth:`Detector.require`, which raises :class:`MissingCapability` (a one-line
input error naming the detector and the capability) when it is absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from halsift.corpus.errors import InputError
from halsift.corpus.sample import CAPTION_INDEX, Item  # noqa: F401 - re-exported: the scored unit lives in corpus


@dataclass
class Result:
    """A detector's verdict on one item."""

    score: float  # 0–100, higher = more likely correct
    parsed: bool = True  # False where the raw output could not be parsed and the score fell back to 50
    spans: list[list[int]] | None = None  # [start_word, end_word) of hallucinated segments, if localized


class DetectorError(ValueError):
    """A detector cannot score the given items (e.g. ``oracle`` without ground-truth labels)."""


SET_LEVEL, LOCALIZATION, VLM_JUDGE, STAGED = "set-level", "localization", "vlm-judge", "staged"
CAPABILITIES = {
    SET_LEVEL: "scores over the whole set (members + combine_scores)",
    LOCALIZATION: "marks hallucinated spans",
    VLM_JUDGE: "a vision-language model judge for multiple-choice QA and likelihoods (vlm:... or a lora: vlm "
               "adapter)",
    STAGED: "fitted on the whole corpus and run by halsift score as a staged job: only the whole of a spec, never "
            "a part of one (spec.check_tree)",
}


class MissingCapability(InputError, DetectorError):
    """A detector lacks a capability a command needs; one line naming both (the CLI exits 2)."""

    def __init__(self, detector: "Detector", capability: str, purpose: str = "") -> None:
        self.detector, self.capability = detector, capability
        need = f"{purpose} needs" if purpose else "needs"
        super().__init__(f"{need} the {capability} capability ({CAPABILITIES[capability]}); detector "
                         f"{detector.spec!r} ({detector.family}) does not have it")


def image_key(it: Item) -> str:
    """An item's image identity across a scored set: ``image_id`` when set, else its ``key``."""
    return it.image_id or it.key


def image_group(it: Item) -> tuple[str, int]:
    """Items that share one decoded image within a batch: the same :func:`image_key` and the same image object.
    Never the row's ``key`` alone: bench rows of one image have distinct keys (their row ids) but one image."""
    return (image_key(it), id(it.image))


def distinct_images(items: Sequence[Item]) -> tuple[list[Any], list[int]]:
    """The distinct images of ``items`` (:func:`image_group`, first-appearance order) and each item's index into
    that list: what a detector encodes once per image."""
    slot: dict[tuple[str, int], int] = {}
    images: list[Any] = []
    index = []
    for it in items:
        k = image_group(it)
        if k not in slot:
            slot[k] = len(images)
            images.append(it.image)
        index.append(slot[k])
    return images, index


def preprocess_side(preprocess: Any) -> int | None:
    """The smallest image side a torchvision ``Compose`` preprocessing needs: its leading ``Resize``'s size (an
    int resizes the short side to it; ``(h, w)`` squashes). None when it starts otherwise (e.g. open_clip's
    keep-ratio modes): such a detector's images are decoded in full."""
    first = next(iter(getattr(preprocess, "transforms", ())), None)
    if type(first).__name__ != "Resize" or getattr(first, "max_size", None):
        return None
    size = first.size
    size = size if isinstance(size, int) else max(size) if len(size) else None
    return int(size) if size else None



def renamed_option(family: str, old: str, old_value: Any, new: str, new_value: Any, default: Any) -> Any:
    """The value of spec option ``new`` of ``family``, also accepted under its former name ``old`` (with a
    warning; giving both is an error). A spec that keeps the old name keeps its canonical text, so its
    fingerprint does not change."""
    if old_value is None:
        return new_value
    if new_value != default:
        raise ValueError(f"{old}= and {new}= name the same {family} option: give only {new}=")
    import warnings

    warnings.warn(f"{family} detector option {old}= is now {new}= (rows per forward pass; not score's "
                  f"--batch-size); the old name still works", FutureWarning, stacklevel=3)
    return old_value

class Detector:
    """Base class. Subclasses set ``family`` and implement :meth:`score_batch`.

    ``spec`` is the canonical spec string (what the score manifest records and compares on resume);
    ``name`` goes into the ``detector`` column of score tables.
    """

    family: ClassVar[str] = ""
    needs_image: ClassVar[bool] = True
    localizes: bool = False  # localization: results carry ``spans``
    set_level: bool = False  # set-level: scores depend on the whole set (``members`` + :meth:`combine_scores`)
    staged: ClassVar[bool] = False  # staged: run as a staged job over the corpus; only at a spec's top (read from
    # the class's source by spec.family_staged, like OPTION_RANGES: declare it on the family's own class)
    judge: Any = None  # vlm-judge: the loaded VLM it lends (a vlm_judge.VlmJudge; not imported: it imports this)
    decode_size: int | None = None  # JPEGs may decode at a reduced scale down to this side (None: in full)
    image_arrays: bool | str = False  # items' images may come as uint8 [H, W, 3] RGB arrays instead of PIL images;
    # "jpeg": plain JPEGs undecoded too (EncodedJpeg: decode=gpu), the rest as arrays

    def __init__(self, spec: str = "") -> None:
        self.spec = spec or self.family

    @property
    def name(self) -> str:
        return self.spec

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        """Score ``items`` (one result per item, same order)."""
        raise NotImplementedError

    def fingerprint_spec(self) -> str:
        """What a score folder's detector fingerprint hashes: the spec, plus any choice it resolved that changes
        scores (a clip detector's ``decode=auto`` on CUDA)."""
        return self.spec

    def take_decode_counts(self) -> dict:
        """How the images scored since the last call were decoded (``{"device", "host", "fallback",
        "unreadable"}`` counts; {} for a detector that does not say), reset."""
        return {}

    def prepare(self, items: Sequence[Item]) -> Any:
        """The CPU half of scoring ``items`` (image preprocessing, tokenization), for the runner's read-ahead
        thread; ``None`` (the default) when the detector has no such half. Must not touch the model."""
        return None

    def score_prepared(self, items: Sequence[Item], prepared: Any) -> list[Result]:
        """Score ``items`` from their :meth:`prepare` output; the same results as :meth:`score_batch`."""
        return self.score_batch(items)

    def capabilities(self) -> frozenset[str]:
        """The :data:`CAPABILITIES` this detector has."""
        have = {SET_LEVEL: self.set_level, LOCALIZATION: self.localizes, VLM_JUDGE: self.judge is not None,
                STAGED: self.staged}
        return frozenset(c for c, on in have.items() if on)

    def require(self, capability: str, purpose: str = "") -> None:
        """Raise :class:`MissingCapability` unless this detector has ``capability`` (``purpose``: the command or
        option that needs it, for the message)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"capability {capability!r}: expected one of {sorted(CAPABILITIES)}")
        if capability not in self.capabilities():
            raise MissingCapability(self, capability, purpose)

    def vlm_judge(self, purpose: str = "") -> Any:
        """The :class:`~halsift.filtering.detectors.vlm_judge.VlmJudge` this detector lends (capability ``vlm-judge``)."""
        self.require(VLM_JUDGE, purpose)
        return self.judge  # type: ignore[return-value]

    def combine_scores(self, member_scores: Any) -> Any:
        """Set-level detectors: one score per item from the members' scores over the whole set
        (``[members, items]`` array)."""
        raise MissingCapability(self, SET_LEVEL)

    def to(self, device: Any) -> "Detector":
        """Move to ``device`` (no-op for detectors without a model)."""
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class PreparedDetector(Detector):
    """A detector that scores in two halves: :meth:`prepare` (CPU: preprocessing, processor, tokenization) and
    :meth:`score_prepared` (the model). Subclasses implement both; :meth:`score_batch` runs one after the other.
    ``score_prepared`` may only count its ``items``: from worker processes it gets the runner's row tuples."""

    def prepare(self, items: Sequence[Item]) -> Any:
        raise NotImplementedError

    def score_prepared(self, items: Sequence[Any], prepared: Any) -> list[Result]:
        raise NotImplementedError

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        return self.score_prepared(items, self.prepare(items)) if items else []
