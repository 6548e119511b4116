"""Basic filters without a model: caption language, word and character counts, image size and aspect ratio.

The fields of one sample (:data:`FIELDS`): ``lang`` (ISO 639-1, '' when undecided) and ``lang_confidence`` (0-1)
from :mod:`halsift.filtering.curation.language`; ``words`` (whitespace-separated tokens, what DataComp's
``fasttext.tokenize`` counts) and ``chars`` (characters of the caption); ``width``, ``height``, ``short_side`` and
``aspect`` (long side / short side, >= 1). Sizes come from the image header (PIL's ``Image.open`` reads the
header only; pixels are decoded on ``load()``, which is never called), or from recorded sizes when the input has
them (img2dataset's ``original_width`` / ``original_height``: its stored image may be resized, DataComp's basic
filter is on the original size; else ``width`` / ``height``). A missing or unreadable size is null, and a rule
on a null field fails.

A preset (:data:`PRESETS`) is a list of named rules; its pass flag is the column ``pass_<preset>``.
``datacomp``: DataComp's basic filter (English by language id, > 2 words, > 5 characters, short side >= 200 px,
aspect ratio <= 3).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

FIELDS = ("key", "lang", "lang_confidence", "words", "chars", "width", "height", "short_side", "aspect")
SCHEMA = pa.schema([("key", pa.string()), ("lang", pa.string()), ("lang_confidence", pa.float32()),
                    ("words", pa.int32()), ("chars", pa.int32()), ("width", pa.int32()), ("height", pa.int32()),
                    ("short_side", pa.int32()), ("aspect", pa.float32())])
_OPS = {"==": operator.eq, ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


@dataclass(frozen=True)
class Rule:
    """One rule of a preset: ``field op value`` (e.g. ``short_side >= 200``)."""

    name: str
    field: str
    op: str
    value: object

    def text(self) -> str:
        return f"{self.field} {self.op} {self.value!r}"

    def passes(self, col: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """Per row: the rule holds (a null field fails)."""
        values = col.to_numpy(zero_copy_only=False)
        valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), bool)
        out = np.zeros(len(values), bool)
        if valid.any():
            out[valid] = _OPS[self.op](values[valid], self.value)
        return out


PRESETS: dict[str, tuple[Rule, ...]] = {
    "datacomp": (Rule("english", "lang", "==", "en"), Rule("words", "words", ">", 2), Rule("chars", "chars", ">", 5),
                 Rule("short_side", "short_side", ">=", 200), Rule("aspect", "aspect", "<=", 3.0)),
}


def pass_column(preset: str) -> str:
    return f"pass_{preset}"


def text_counts(caption: str) -> tuple[int, int]:
    """(words, characters) of a caption: whitespace tokens, as DataComp's ``fasttext.tokenize``, and ``len``."""
    return len(caption.split()), len(caption)


def header_size(image: bytes) -> tuple[int, int] | None:
    """(width, height) from the image header, without decoding the pixels and whatever the size; ``None`` when
    unreadable (:func:`halsift.corpus.images.header_size`)."""
    from halsift.corpus.images import header_size as size_of

    return size_of(image)


def recorded_size(meta: dict) -> tuple[int, int] | None:
    """The size a sample's metadata records (img2dataset's original size first, else width/height)."""
    for wk, hk in (("original_width", "original_height"), ("width", "height")):
        w, h = meta.get(wk), meta.get(hk)
        if isinstance(w, (int, float)) and isinstance(h, (int, float)) and w > 0 and h > 0 \
                and not isinstance(w, bool) and not isinstance(h, bool):
            return int(w), int(h)
    return None


def fields_table(keys: list[str], langs: list[tuple[str, float]], captions: list[str],
                 sizes: list[tuple[int, int] | None]) -> pa.Table:
    """The field table (:data:`SCHEMA`) of a batch of samples."""
    words, chars = zip(*(text_counts(c) for c in captions)) if captions else ((), ())
    w = [s[0] if s else None for s in sizes]
    h = [s[1] if s else None for s in sizes]
    short = [min(s) if s else None for s in sizes]
    aspect = [max(s) / min(s) if s else None for s in sizes]
    return pa.table({"key": keys, "lang": [lang for lang, _ in langs], "lang_confidence": [c for _, c in langs],
                     "words": list(words), "chars": list(chars), "width": w, "height": h, "short_side": short,
                     "aspect": aspect}, schema=SCHEMA)


def apply_presets(t: pa.Table, presets: list[str]) -> tuple[pa.Table, dict]:
    """Add ``pass_<preset>`` to a field table; returns it and, per preset, the rows each rule removes (alone),
    removes and no other rule does (``only``), and the rows passing every rule."""
    counts = {}
    for name in presets:
        rules = PRESETS[name]
        ok = np.stack([r.passes(t[r.field]) for r in rules]) if len(t) else np.ones((len(rules), 0), bool)
        fails = ~ok
        alone = fails.sum(axis=1)
        only = (fails & (fails.sum(axis=0) == 1)).sum(axis=1)
        passed = ok.all(axis=0)
        counts[name] = {"samples": len(t), "passed": int(passed.sum()),
                        "removed": {r.name: int(n) for r, n in zip(rules, alone)},
                        "removed_only": {r.name: int(n) for r, n in zip(rules, only)}}
        t = t.append_column(pass_column(name), pa.array(passed, pa.bool_()))
    return t, counts


def merge_counts(total: dict, part: dict) -> dict:
    """Add one part's :func:`apply_presets` counts to ``total`` (in place; returned)."""
    for name, c in part.items():
        t = total.setdefault(name, {"samples": 0, "passed": 0, "removed": {}, "removed_only": {}})
        t["samples"] += c["samples"]
        t["passed"] += c["passed"]
        for k in ("removed", "removed_only"):
            for rule, n in c[k].items():
                t[k][rule] = t[k].get(rule, 0) + n
    return total
