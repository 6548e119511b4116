"""``cascade``: a cheap detector over everything, an expensive judge only where it can change the selection.

A cascade is not a per-batch detector (its band and mapping are fitted on the whole corpus): ``halsift score`` runs it
as a staged job (:mod:`halsift.filtering.scoring.cascade`). This module holds the two families that job is built
from: :class:`CascadeDetector` (the spec: options, checks, canonical form) and :class:`SubsetDetector` (a detector
that calls its inner detector only on the units listed in a key file: each judged stage is an ordinary score run of
one). Spec strings nest the member specs in brackets:
``cascade:cheap=[clip:arch=halsift-tiny,checkpoint=M],judge=[lora:DIR],budget=0.25``; a YAML file names them as
fields (``family: cascade``, ``cheap: {family: clip, ...}``, ``judge: lora:DIR``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from halsift.filtering.detectors.base import Detector, DetectorError, Item, Result

AGGS = ("sentence", "mean", "min")  # the cascade's unit: each sentence, or whole captions ranked by this aggregate

PLACEHOLDER = 50.0  # the score a subset run writes for the units outside its key file (never read back)


def spec_text(spec: Any) -> str:
    """A member spec (a string, or a mapping with ``family``) as one canonical line, for comparisons."""
    if isinstance(spec, dict):
        from halsift.filtering.detectors.spec import _split_family, format_spec

        family, opts, _ = _split_family(spec)
        return format_spec(family, {k: spec_text(v) if isinstance(v, dict) else v for k, v in opts.items()})
    return str(spec).strip()


class CascadeDetector(Detector):
    """Options: ``cheap`` (spec), ``judge`` (spec), ``budget`` (largest share of the units the judge scores),
    ``keep`` (the selection cut aimed at), ``sample`` (share of the budget spent on the random sample), ``seed``,
    ``agg`` (``sentence``, or ``mean``/``min``: the selection keeps whole captions ranked by that aggregate, and the
    cascade judges whole captions), ``learn`` (a ``halsift embed`` folder of the corpus: refine the cheap score with a
    head on those vectors taught by the judge's sample, :mod:`halsift.filtering.scoring.cascade_learn`), ``plan`` (a
    cascade score folder whose frozen plan this run applies: calibration units)."""

    family = "cascade"
    set_level = True  # depends on the whole corpus: run by halsift score as a staged job, never per batch
    staged = True  # capability staged: only the whole of a spec (spec.check_tree), never a member, cheap or judge

    # one line of help per spec option (docs/config.md, --describe); a test keeps it in step with __init__
    OPTION_HELP = {
        "cheap": "the detector that scores every unit (a spec, in brackets inside a spec string)",
        "judge": "the expensive detector, called only on a random sample and the band around the cut (a spec)",
        "budget": "the largest share of the units the judge may score (0-1)",
        "keep": "the selection cut the band is placed around: the share of units kept (0-1)",
        "sample": "the share of the budget spent on the uniform random sample that fits the mapping (0-1)",
        "seed": "the random sample is a hash of (seed, key, sentence index): the same for every run",
        "agg": "sentence (the cut is on sentences), or mean / min: the selection keeps whole captions ranked by that "
               "aggregate of their sentence scores, and the sample and the band are whole captions",
        "learn": "a `halsift embed` folder of the corpus: before the band is placed, the judge's random sample teaches "
                 "a ridge head on those CLIP vectors and the cheap score, whose prediction replaces the cheap score "
                 "(no extra judge call; default: the cheap score as it is)",
        "plan": "a cascade score folder (or its _cascade/plan.json): apply its frozen plan instead of fitting one "
                "(score calibration units through the corpus's cascade)",
    }

    # the options' ranges, declared once: the dry run (check_spec), --describe and the build check them
    OPTION_RANGES = {"seed": "[0, inf)", "budget": "(0, 1]", "keep": "(0, 1]", "sample": "(0, 1]"}

    def __init__(self, cheap: str | dict = "", judge: str | dict = "", budget: float = 0.25, keep: float = 0.2,
                 sample: float = 0.3, seed: int = 0, agg: str = "sentence", learn: str = "",
                 plan: str | None = None) -> None:
        super().__init__()
        from halsift.filtering.detectors.spec import check_spec

        for name, v in (("cheap", cheap), ("judge", judge)):
            if not v or not isinstance(v, (str, dict)):
                raise ValueError(f"{name}={v!r}: expected a detector spec")
            check_spec(v)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed={seed!r}: expected an integer")
        if agg not in AGGS:
            raise ValueError(f"agg={agg!r}: expected one of {', '.join(AGGS)} (the selection's caption aggregate, "
                             "or sentence)")
        if not isinstance(learn, str):
            raise ValueError(f"learn={learn!r}: expected a `halsift embed` folder of the corpus")
        self.agg, self.learn = agg, learn
        self.cheap, self.judge_spec = cheap, judge
        self.budget, self.keep, self.sample, self.seed = float(budget), float(keep), float(sample), seed
        self.plan = plan

    def canonical(self) -> str:
        """The spec without ``plan``: the corpus's cascade and the calibration run through its plan share it, so
        ``select --calibration`` sees the same detector."""
        from halsift.filtering.detectors.spec import format_spec

        return format_spec("cascade", {"cheap": f"[{spec_text(self.cheap)}]",
                                       "judge": f"[{spec_text(self.judge_spec)}]",
                                       "budget": self.budget, "keep": self.keep, "sample": self.sample,
                                       "seed": self.seed, **({"agg": self.agg} if self.agg != "sentence" else {}),
                                       **({"learn": self.learn} if self.learn else {})})

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        raise DetectorError("cascade: fitted on the whole corpus, so it runs as a staged job: halsift score "
                            "--detector CASCADE --data SHARDS --out DIR (not per batch)")


def _read_keys(keys: str) -> set[tuple[str, int]]:
    """The units a key file lists: ``(key, sentence_index)`` pairs."""
    import pyarrow.parquet as pq

    t = pq.read_table(keys, columns=["key", "sentence_index"])
    return set(zip(t["key"].to_pylist(), t["sentence_index"].to_pylist()))


class SubsetDetector(Detector):
    """Options: ``detector`` (spec), ``keys`` (a parquet file of ``key``, ``sentence_index``). Calls the detector
    on the listed units only; every other unit gets :data:`PLACEHOLDER` (a cascade reads back the listed rows
    only)."""

    family = "subset"

    OPTION_HELP = {
        "detector": "the detector called on the listed units (a spec)",
        "keys": "a parquet file with columns key, sentence_index: the units to score",
    }

    def __init__(self, detector: str | dict = "", keys: str = "") -> None:
        super().__init__()
        from halsift.filtering.detectors.spec import load_detector

        if not keys:
            raise ValueError("keys: expected a parquet file of key, sentence_index")
        self.inner = load_detector(detector)
        if self.inner.set_level:
            raise ValueError(f"detector={self.inner.spec!r}: a set-level detector cannot score a subset")
        self.keys = _read_keys(keys)
        self.needs_image = self.inner.needs_image
        self.decode_size, self.image_arrays = self.inner.decode_size, self.inner.image_arrays
        self.calls = 0  # units passed to the inner detector (tests)

    def to(self, device) -> "SubsetDetector":
        self.inner.to(device)
        return self

    def fingerprint_spec(self) -> str:
        """The inner detector's fingerprint and the listed units' content (not the key file's path or mtime: two
        tasks that each wrote the same key file, or a moved folder, score the same subset)."""
        import hashlib
        import json

        units = hashlib.blake2b(json.dumps(sorted(self.keys)).encode(), digest_size=16).hexdigest()
        return f"subset:detector=[{self.inner.fingerprint_spec()}],units={units}"

    def with_keys(self, keys: str) -> "SubsetDetector":
        """The same inner detector (loaded once) on the units of another key file: a cascade's band after its
        sample. Its spec is the one :func:`~halsift.filtering.detectors.spec.load_detector` gives that key file."""
        import copy

        from halsift.filtering.detectors.spec import format_spec, parse_spec

        other = copy.copy(self)
        other.keys = _read_keys(keys)
        family, opts = parse_spec(self.spec)
        other.spec = format_spec(family, {**opts, "keys": keys})
        other.calls = 0
        return other

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        chosen = [i for i, it in enumerate(items) if (it.key, it.sentence_index) in self.keys]
        out = [Result(PLACEHOLDER) for _ in items]
        if chosen:
            self.calls += len(chosen)
            for i, r in zip(chosen, self.inner.score_batch([items[i] for i in chosen])):
                out[i] = r
        return out
