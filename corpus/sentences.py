"""Sentence splitting with positions, and the word tokenisation that word spans refer to.

Benchmarks label captions sentence by sentence, so every stage must cut a caption the same way.
:func:`split_sentences` is a small rule-based splitter (no model, no download) tuned to captioner output:

* a sentence ends at ``.``, ``!``, ``?`` or an ellipsis (``...``/``…``), optionally followed by closing
  quotes or brackets, when whitespace follows *and* the next sentence starts with an upper-case letter,
  a digit or an opening quote/bracket (so ``"Hi!" she said.`` and ``wait... what`` stay whole);
* no split after title-like abbreviations (``Dr. Smith``, ``St. Louis``, ``e.g. A``, ``vs. B``, see
  :data:`NEVER_SPLIT_AFTER`), after ``No.``/``p.`` before a number, or after a single capital initial
  or dotted capitals (``J. K. Rowling``, ``U.S. Army``); decimals (``3.5``) and dotted words never contain
  "punctuation + space", so they never split;
* a blank line always ends a sentence; a single newline does too, unless the next line starts with a
  lower-case letter (a soft-wrapped line, joined to the sentence before);
* bullet and numbered list markers (``-``, ``*``, ``•``, ``1.``, ``2)``, ``(3)``, ``a)``) at the start of a
  line or sentence are not part of the sentence: each list item is a sentence of its own.

Sentence ``start``/``end`` are character offsets into the input, so ``text[s.start:s.end] == s.text``.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

# Lower-cased tokens (without their final dot) after which "." never ends a sentence: they introduce what
# follows (titles, Latin abbreviations). "etc." is absent on purpose: it often ends a sentence.
NEVER_SPLIT_AFTER = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "st", "mt", "ft", "sgt", "capt", "col", "gen", "lt", "rev", "hon",
    "gov", "sen", "rep", "pres", "e.g", "eg", "i.e", "ie", "cf", "vs", "viz", "approx", "ca", "fig", "figs",
    "vol", "esp", "incl",
})
# Abbreviations that only precede a number ("No. 5", "p. 12").
SPLIT_UNLESS_NUMBER = frozenset({"no", "nos", "p", "pp", "nr", "art", "ch"})

_BOUNDARY = re.compile(r"(?:\.{2,}|…|[.!?])+[\"'”’)\]»]*(?=\s)")
_LIST_MARKER = re.compile(r"(?:[-*•·‣▪◦–—]|\(?\d{1,3}[.)]|\(\d{1,3}\)|\(?[a-z]\))[ \t]+")
_INITIALS = re.compile(r"^(?:[A-Z]\.)*[A-Z]$")
_OPENERS = "\"'“‘([«"
_PUNCT = string.punctuation + "“”‘’«»…–—"


@dataclass(frozen=True)
class Sentence:
    """One sentence: its text, 0-based position in the caption, and ``[start, end)`` character offsets."""

    text: str
    position: int
    start: int
    end: int


def words(text: str) -> list[str]:
    """The word tokens that word spans index: ``text.split()`` (whitespace split, punctuation kept attached).

    A span ``[i, j)`` of a sentence means ``words(sentence)[i:j]``. Whitespace splitting is used because it
    is what annotation tools show and it is stable under re-joining with single spaces.
    """
    return text.split()


def _norm(token: str) -> str:
    return token.strip(_PUNCT).lower()


def find_word_span(sentence: str, phrase: str, start: int = 0) -> tuple[int, int] | None:
    """The first ``[start_word, end_word)`` of ``sentence`` whose words equal ``phrase``'s words.

    Comparison ignores case and punctuation at word edges (``"Red,"`` matches ``red``). Returns None when
    the phrase does not occur (or has no words); ``start`` skips earlier words.
    """
    target = [w for w in (_norm(t) for t in words(phrase)) if w]
    toks = [_norm(t) for t in words(sentence)]
    n = len(target)
    if not n:
        return None
    for i in range(start, len(toks) - n + 1):
        if toks[i:i + n] == target:
            return i, i + n
    return None


def _blocks(text: str) -> list[tuple[int, int]]:
    """Character ranges of line blocks: hard line breaks end a block, soft-wrapped lines are joined."""
    blocks: list[tuple[int, int]] = []
    pos = 0
    for line in text.splitlines(keepends=True):
        start, end = pos, pos + len(line.rstrip("\r\n"))
        pos += len(line)
        body = line.strip()
        if not body:
            blocks.append((start, start))  # a blank line: ends the block before it
            continue
        soft = (blocks and blocks[-1][1] > blocks[-1][0] and body[0].islower()
                and not _LIST_MARKER.match(body))
        if soft:
            blocks[-1] = (blocks[-1][0], end)
        else:
            blocks.append((start, end))
    return [b for b in blocks if b[1] > b[0]]


def _skip_marker(text: str, i: int, end: int) -> int:
    """Index after leading whitespace and a list marker starting at ``i``."""
    while i < end and text[i].isspace():
        i += 1
    m = _LIST_MARKER.match(text, i, end)
    if m:
        i = m.end()
        while i < end and text[i].isspace():
            i += 1
    return i


def _ends_sentence(text: str, punct_start: int, punct: str, nxt: int, end: int) -> bool:
    """Whether the punctuation ``punct`` at ``punct_start`` ends a sentence whose successor starts at ``nxt``."""
    if nxt >= end:
        return True
    c = text[nxt]
    if not (c.isupper() or c.isdigit() or c in _OPENERS):
        return False
    if punct.rstrip("\"'”’)]»") != ".":
        return True  # ! ? ellipsis
    # the word right before the dot, without opening quotes/brackets
    j = punct_start
    while j > 0 and not text[j - 1].isspace():
        j -= 1
    prev = text[j:punct_start].lstrip(_OPENERS)
    low = prev.lower()
    if low in NEVER_SPLIT_AFTER:
        return False
    if low in SPLIT_UNLESS_NUMBER and c.isdigit():
        return False
    if _INITIALS.match(prev):
        return False  # an initial or a dotted acronym: "J. K. Rowling", "U.S. Army"
    return True


def split_sentences(text: str) -> list[Sentence]:
    """Split ``text`` into sentences with positions and character offsets (rules in the module docstring).

    Sentences with no letter or digit (a stray ``-`` or ``...``) are dropped; positions count the rest.
    """
    spans: list[tuple[int, int]] = []
    for b_start, b_end in _blocks(text):
        seg = _skip_marker(text, b_start, b_end)
        for m in _BOUNDARY.finditer(text, seg, b_end):
            if m.start() < seg:
                continue
            nxt = m.end()
            while nxt < b_end and text[nxt].isspace():
                nxt += 1
            if not _ends_sentence(text, m.start(), m.group(), nxt, b_end):
                continue
            spans.append((seg, m.end()))
            seg = _skip_marker(text, nxt, b_end)
        if seg < b_end:
            spans.append((seg, b_end))
    out: list[Sentence] = []
    for s, e in spans:
        while e > s and text[e - 1].isspace():
            e -= 1
        piece = text[s:e]
        if any(ch.isalnum() for ch in piece):
            out.append(Sentence(piece, len(out), s, e))
    return out


def sentence_texts(text: str) -> list[str]:
    """Just the sentence strings of :func:`split_sentences`."""
    return [s.text for s in split_sentences(text)]
