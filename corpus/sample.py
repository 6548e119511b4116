"""The sample every stage reads: what a valid shard sample is, decided in one place (DESIGN.md, "One reader").

:func:`read_shard` / :func:`read_samples` stream a shard's samples (:func:`~halsift.corpus.shards.iter_shard`)
through :func:`validate` and yield :class:`ValidSample` s; every sample they leave out is counted in a
:class:`~halsift.corpus.images.SkipCounter` by kind, with its key and reason. Scoring, training (``train clip``,
caption pre-training) and the evals that read shards all read through here, so they keep and skip the same
samples. The rules, first match wins (the kind counted in parentheses):

1. the key repeats an earlier sample of the same shard, or the caption is not valid UTF-8 (``duplicate``,
   ``bad_caption``: counted by :func:`~halsift.corpus.shards.iter_shard`; the first sample of a key is kept; a key
   in two shards is refused by the stages that see every shard, :func:`key_in_two_inputs`);
2. the ``.json`` is not a JSON object, or not UTF-8 (``corrupt``; a sample without ``.json`` is allowed);
3. no image member (``missing_image``);
4. the caption (``.txt``) is missing or blank (``empty_caption``);
5. the caption splits into no sentence, e.g. only punctuation (``empty_caption``; :func:`sentences_of`);
6. the image does not decode (its kind: :func:`~halsift.corpus.images.decode_image`'s robust rules); read
   without decoding, its header still says no more pixels than the one limit (``bomb``:
   :func:`~halsift.corpus.images.check_size`);
7. the shard is truncated or unreadable (``corrupt_shard``, after its readable samples; n = samples lost).

The items a detector scores (:class:`Item`) are made here too, from a sample (:func:`sample_items`), a caption
(:func:`caption_items`) or a caption's bench rows (:func:`bench_items`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from halsift.corpus.images import DEFAULT_MAX_PIXELS, ImageDecodeError, SkipCounter, check_size, image_decoder
from halsift.corpus.sentences import sentence_texts
from halsift.corpus.shards import Sample, ShardFormatError, expand_shards, iter_shard

CAPTION_INDEX = -1  # ``sentence_index`` of a whole-caption score (``unit="caption"``)
_TRUTH_FIELDS = ("label", "types", "spans")


@dataclass
class Item:
    """One thing to score: a sentence of a caption, with the caption's preceding sentences and its image."""

    key: str  # sample key (shards) or row id (bench)
    sentence_index: int  # position of the sentence in its caption; CAPTION_INDEX for a whole caption
    sentence: str
    context: list[str] = field(default_factory=list)  # the caption's sentences before this one
    image: Any = None  # a PIL image (RGB); a uint8 [H, W, 3] RGB array for ``image_arrays`` detectors; None: text-only
    image_id: str = ""  # items with the same image_id share one image (``image_group``; else the key decides)
    meta: dict = field(default_factory=dict)  # captioner, source, ground truth ("label", "types", "spans")


@dataclass
class ValidSample:
    """A shard sample that passed :func:`validate`."""

    key: str
    image: Any  # RGB PIL image, or uint8 [H, W, 3] array (``arrays=True``); None when read with ``decode=False``
    caption: str  # the ``.txt`` text
    sentences: list[str]  # the json's ``sentences`` texts where it has them, else the caption split
    truth: list[dict] | None  # the json's per-sentence records (``label``, ``types``, ``spans``), None without
    meta: dict  # the ``.json`` object ({} when the sample has none)
    stored: Sample  # as stored: image bytes, extension, shard name

    @property
    def labels(self) -> list[str | None]:
        """Per-sentence ground-truth labels (None where unlabelled)."""
        return [t.get("label") for t in self.truth] if self.truth else [None] * len(self.sentences)

    @property
    def captioner(self) -> str:
        return self.stored.captioner

    @property
    def source(self) -> str:
        return self.stored.source


def sentences_of(meta: dict, caption: str) -> tuple[list[str], list[str | None], list[dict] | None]:
    """``(texts, labels, truth)`` of a sample: the json's ``sentences`` records when it holds a non-empty list of
    objects with ``text`` (``truth`` = those records), else :func:`~halsift.corpus.sentences.sentence_texts` of the
    caption (labels None, ``truth`` None)."""
    sents = meta.get("sentences")
    if isinstance(sents, list) and sents and all(isinstance(s, dict) and "text" in s for s in sents):
        return [str(s["text"]) for s in sents], [s.get("label") for s in sents], sents
    texts = sentence_texts(caption)
    return texts, [None] * len(texts), None


def caption_label(labels: Sequence[str | None]) -> str | None:
    """A caption's label from its sentences': ``incorrect`` if any is, ``correct`` if all are, else ``unknown``;
    None when any sentence is unlabelled (or there are none)."""
    if not labels or any(lab is None for lab in labels):
        return None
    if "incorrect" in labels:
        return "incorrect"
    return "correct" if all(lab == "correct" for lab in labels) else "unknown"


def _text_flaw(sample: Sample) -> tuple[str, str] | None:
    """(reason, kind) of the first rule a sample's members break before its image is decoded, or None."""
    if sample.meta.get("_bad_json"):
        return "json member is not a valid JSON object", "corrupt"
    if not sample.image and not sample.ext:
        return "sample has no image member", "missing_image"
    if not sample.caption.strip():
        return "empty caption", "empty_caption"
    return None


def validate(sample: Sample, skipped: SkipCounter, *, decode: bool = True, draft: int | None = None,
             arrays: bool | str = False, max_pixels: int = DEFAULT_MAX_PIXELS) -> ValidSample | None:
    """The sample as a :class:`ValidSample`, or None after counting in ``skipped`` the rule it breaks (module
    docstring). ``decode=False`` checks every rule but the image decoding (the image is left None); ``draft``,
    ``arrays``, ``max_pixels``: as :func:`~halsift.corpus.images.decode_sample` takes them (``"jpeg"``: plain JPEGs
    kept undecoded, :class:`~halsift.corpus.images.EncodedJpeg`)."""
    flaw = _text_flaw(sample)
    if flaw is not None:
        skipped.add(sample.key, *flaw)
        return None
    texts, _, truth = sentences_of(sample.meta, sample.caption)
    if not texts:
        skipped.add(sample.key, "caption has no sentences", "empty_caption")
        return None
    image = None
    try:
        if decode:
            image = image_decoder(arrays)(sample.image, sample.key, max_pixels, draft)
        else:  # the same size limit without decoding: every stage keeps and skips the same samples
            check_size(sample.image, sample.key, max_pixels)
    except ImageDecodeError as e:
        skipped.add_error(e)
        return None
    return ValidSample(sample.key, image, sample.caption, texts, truth, sample.meta, sample)


def read_shard(path: str | os.PathLike, skipped: SkipCounter, **opts: Any) -> Iterator[ValidSample]:
    """The valid samples of one shard, in order; the rest are counted in ``skipped`` (module docstring). A damaged
    shard is counted as ``corrupt_shard`` (key = its file name, n = the samples lost) after its readable samples;
    a missing one raises ``FileNotFoundError``. ``opts``: :func:`validate`'s."""
    try:
        for sample in iter_shard(path, skipped):  # a repeated key or a non-UTF-8 caption is counted there
            valid = validate(sample, skipped, **opts)
            if valid is not None:
                yield valid
    except ShardFormatError as e:
        skipped.add(Path(path).name, str(e), "corrupt_shard", n=e.lost or 1)


def read_samples(spec: str | os.PathLike | Iterable, skipped: SkipCounter, **opts: Any) -> Iterator[ValidSample]:
    """:func:`read_shard` over every shard of ``spec`` (:func:`~halsift.corpus.shards.expand_shards`)."""
    for path in expand_shards(spec):
        yield from read_shard(path, skipped, **opts)


def nothing_read(samples: int, skipped: dict, verb: str) -> str | None:
    """The one empty-input rule of the stages that read shards (score, dedup, basic): no valid sample at all (0-byte
    or empty tars, every sample skipped) is an error, and this is its line (``nothing to VERB: ...`` with the skip
    counts by kind and an example), else None. ``skipped``: a :class:`SkipCounter`'s JSON."""
    if samples:
        return None
    kinds = skipped.get("by_kind") or {}
    why = ", ".join(f"{k}={v}" for k, v in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"nothing to {verb}: {skipped.get('total', 0)} sample(s) skipped" + (f" ({why})" if why else "") +
            (f"; e.g. {skipped['samples'][0]['key']}: {skipped['samples'][0]['reason']}"
             if skipped.get("samples") else "; the input holds no samples"))


def key_in_two_inputs(key: str, first: str, second: str, stage: str) -> str:
    """The one line of the duplicate-key rule of the stages that read shards or tables (dedup, basic, embed; select
    refuses a repeated score row alike): a key names one sample, so a key found in two inputs (shards, tables, or
    the parts made from them) is refused, naming both; within one input a repeat is skipped as ``duplicate``."""
    return (f"{stage}: the key {key!r} names samples in two inputs ({first} and {second}); a key must name one "
            "sample of the corpus (select refuses it too)")


KEYS_MEMORY = "128MB"  # DuckDB's memory for the key grouping of repeated_key (flat peak memory at any corpus size)


def repeated_key(parts: Sequence[str | os.PathLike], column: str = "key") -> tuple[str, int, int] | None:
    """``(key, i, j)``, ``i < j``, for a key found in two of ``parts`` (parquet files, indices into the list), else
    None. Any number of rows per key within one part is allowed (a sample's image, caption and sentence rows);
    one DuckDB query over the key columns in at most :data:`KEYS_MEMORY` (it spills beyond), so memory stays flat
    for a corpus of any size."""
    if len(parts) < 2:
        return None
    import duckdb

    files = [os.fspath(p) for p in parts]
    spill = tempfile.mkdtemp(prefix="halsift-keys-")  # beyond KEYS_MEMORY the grouping spills here
    con = duckdb.connect(config={"memory_limit": KEYS_MEMORY, "temp_directory": spill, "threads": 1,
                                 "preserve_insertion_order": False})
    try:
        hit = con.execute(
            f'SELECT CAST("{column}" AS VARCHAR) AS k, min(filename), max(filename) FROM read_parquet($1, '
            "filename = true, union_by_name = true) GROUP BY k HAVING min(filename) <> max(filename) LIMIT 1",
            [files]).fetchone()
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    if hit is None:
        return None
    index = {f: i for i, f in enumerate(files)}
    i, j = sorted((index[hit[1]], index[hit[2]]))
    return hit[0], i, j


# ---------------------------------------------------------------------------------------------- items
def caption_items(key: str, caption: str, sentences: Sequence[str], image: Any = None, image_id: str = "",
                  meta: dict | None = None, truth: Sequence[dict] | None = None, unit: str = "sentence") -> list[Item]:
    """The items of one caption: one per sentence (with the sentences before it as context and its ``truth``
    record's label/types/spans in ``meta``), or with ``unit="caption"`` one whole-caption item
    (:data:`CAPTION_INDEX`) labelled by :func:`caption_label`."""
    base = dict(meta or {})
    gts = [{k: t[k] for k in _TRUTH_FIELDS if k in t} for t in truth] if truth else [{} for _ in sentences]
    if unit == "caption":
        label = caption_label([g.get("label") for g in gts])
        return [Item(key, CAPTION_INDEX, caption, [], image, image_id, {**base, **({"label": label} if label else {})})]
    texts = list(sentences)
    return [Item(key, i, t, texts[:i], image, image_id, {**base, **g}) for i, (t, g) in enumerate(zip(texts, gts))]


def sample_items(sample: ValidSample, unit: str = "sentence") -> list[Item]:
    """:func:`caption_items` of a shard sample (``meta``: its captioner and source; ``image_id``: the json's
    ``image_id``, else the key)."""
    meta = {"captioner": sample.captioner, "source": sample.source}
    return caption_items(sample.key, sample.caption, sample.sentences, sample.image,
                         str(sample.meta.get("image_id", sample.key)), meta, sample.truth, unit)


def bench_items(rows: Sequence, image: Any = None) -> list[Item]:
    """The items of one caption's bench rows (:class:`~halsift.corpus.bench.BenchRow`, any order): in position
    order, each with the caption's earlier sentences as context and the row's generator and ground truth."""
    rows = sorted(rows, key=lambda r: r.position)
    texts = [r.sentence for r in rows]
    return [Item(r.id, r.position, r.sentence, texts[:i], image, r.image_id,
                 {"captioner": r.generator, "source": r.generator_type, "label": r.label, "types": r.types,
                  "spans": r.spans}) for i, r in enumerate(rows)]


__all__ = ["CAPTION_INDEX", "Item", "ValidSample", "bench_items", "caption_items", "caption_label", "key_in_two_inputs",
           "nothing_read", "read_samples", "read_shard", "repeated_key", "sample_items", "sentences_of", "validate"]
