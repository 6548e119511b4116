"""Sentence building with tagged words: templates are filled with phrases whose words carry tags, and the word
spans (``[start, end)`` over ``sentence.split()``) of chosen tags become the hallucination spans."""

from __future__ import annotations

import random
import re

from .scene import CELLS, NUMBER_WORDS, SHAPE_PLURALS, Group

Piece = tuple[str, str | None]  # (text, tag); a tag names what the words state ("colour", "count", ...)
_SLOT = re.compile(r"\{(\w+)\}")

DIR_WORDS = {"left": "left", "right": "right", "up": "upward", "down": "downward"}
COLOUR_SYNONYMS = {"red": "scarlet", "green": "emerald", "blue": "cobalt", "yellow": "golden",
                   "purple": "violet", "orange": "amber", "black": "jet-black"}
SHAPE_SYNONYMS = {"circle": "disc", "square": "box", "diamond": "rhombus"}


def fill(template: str, slots: dict[str, list[Piece]]) -> tuple[str, dict[str, list[list[int]]]]:
    """Fill ``{SLOT}`` markers with tagged pieces; returns the sentence and, per tag, its word spans.

    The first letter is capitalised. Spans are word indices over ``sentence.split()``, end exclusive.
    """
    out: list[str] = []
    ranges: list[tuple[int, int, str]] = []  # char ranges of tagged pieces
    pos = 0
    last = 0
    for m in _SLOT.finditer(template):
        lit = template[last:m.start()]
        out.append(lit)
        pos += len(lit)
        pieces = [p for p in slots[m.group(1)] if p[0]]
        for k, (text, tag) in enumerate(pieces):
            if k:
                out.append(" ")
                pos += 1
            if tag:
                ranges.append((pos, pos + len(text), tag))
            out.append(text)
            pos += len(text)
        last = m.end()
    out.append(template[last:])
    text = "".join(out)
    text = text[:1].upper() + text[1:]
    words = [(w.start(), w.end()) for w in re.finditer(r"\S+", text)]
    spans: dict[str, list[list[int]]] = {}
    for a, b, tag in ranges:
        idx = [i for i, (s, e) in enumerate(words) if s < b and e > a]
        if idx:
            spans.setdefault(tag, []).append([idx[0], idx[-1] + 1])
    return text, spans


def merge_spans(spans: list[list[int]]) -> list[list[int]]:
    """Sort and merge overlapping or touching ``[start, end)`` spans."""
    out: list[list[int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def article(next_word: str) -> str:
    return "an" if next_word[:1].lower() in "aeiou" else "a"


def colour_word(colour: str, rng: random.Random, fancy: float) -> str:
    return COLOUR_SYNONYMS[colour] if rng.random() < fancy else colour


def shape_word(shape: str, plural: bool, rng: random.Random, fancy: float) -> str:
    word = SHAPE_SYNONYMS.get(shape, shape) if rng.random() < fancy else shape
    if not plural:
        return word
    return SHAPE_PLURALS.get(word, word + ("es" if word.endswith("x") else "s"))


def np_indef(g: Group, rng: random.Random, *, fancy: float = 0.0, with_size: bool = True,
             wrong: set[str] = frozenset()) -> list[Piece]:
    """'a large red triangle' / 'two small blue circles', each word tagged with the attribute it states.

    A tag in ``wrong`` is suffixed with ``!`` so callers can find the hallucinated words.
    """
    def t(tag: str) -> str:
        return tag + "!" if tag in wrong else tag

    size = [(g.size, t("size"))] if with_size else []
    col = colour_word(g.colour, rng, fancy)
    first = size[0][0] if size else col
    count = article(first) if g.count == 1 else NUMBER_WORDS[g.count]
    return [(count, t("count")), *size, (col, t("colour")), (shape_word(g.shape, g.count > 1, rng, fancy), t("shape"))]


def np_def(g: Group, rng: random.Random, *, fancy: float = 0.0, wrong: set[str] = frozenset()) -> list[Piece]:
    """'the red triangle' / 'the blue circles'."""
    def t(tag: str) -> str:
        return tag + "!" if tag in wrong else tag

    return [("the", None), (colour_word(g.colour, rng, fancy), t("colour")),
            (shape_word(g.shape, g.count > 1, rng, fancy), t("shape"))]


def be(g: Group) -> list[Piece]:
    return [("is" if g.count == 1 else "are", None)]


def loc(cell: int, tag: str = "cell") -> list[Piece]:
    prep, words = CELLS[cell]
    return [(prep, None), (words, tag)]


def words(text: str, tag: str | None = None) -> list[Piece]:
    return [(text, tag)]
