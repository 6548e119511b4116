"""Reading a localizing judge's reply: the ``**[...]**`` segments it marks (e.g. ``A **[red]** bird singing in a
tree.``, often inside a ```` ```json {"output": "..."} ``` ```` block) as ``[start_word, end_word)`` ranges over
whitespace words — the bench's ``spans`` convention. Used by the ``vlm`` detector's ``localize`` mode and by the
localization metrics (:mod:`halsift.eval.metrics.localization`)."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence

Span = tuple[int, int]

_MARK = re.compile(r"\*\*\[(.*?)\]\*\*", re.S)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)
_OUTPUT = re.compile(r'"output"\s*:\s*"((?:[^"\\]|\\.)*)"', re.S)
_WORD = re.compile(r"\S+")


def unwrap_output(text: str) -> str:
    """The marked sentence inside a judge reply: the ``output`` value of a (fenced) JSON object, else the text."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for c in candidates:
        try:
            obj = json.loads(c.strip())
        except (json.JSONDecodeError, ValueError):
            m = _OUTPUT.search(c)
            if m:
                try:
                    return json.loads(f'"{m.group(1)}"')
                except json.JSONDecodeError:
                    return m.group(1)
            continue
        if isinstance(obj, dict) and isinstance(obj.get("output"), str):
            return obj["output"]
    m = _FENCE.search(text)
    return m.group(1).strip() if m else text


def _word_offsets(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _WORD.finditer(text)]


def parse_marked(text: str, sentence: str | None = None) -> list[Span]:
    """Word ranges ``[start, end)`` of the ``**[...]**`` segments in a judge reply.

    Words are whitespace-separated, counted in the reply with the markers removed. When ``sentence`` is given
    and the judge rewrote it, the indices are mapped onto the sentence's words by aligning the two word lists
    (difflib); segments whose words do not occur in the sentence are dropped. No marker -> ``[]``.
    """
    out = unwrap_output(text)
    clean, ranges, pos = [], [], 0
    length = 0
    for m in _MARK.finditer(out):
        clean.append(out[pos:m.start()])
        length += m.start() - pos
        inner = m.group(1)
        ranges.append((length, length + len(inner)))
        clean.append(inner)
        length += len(inner)
        pos = m.end()
    clean.append(out[pos:])
    cleaned = "".join(clean)
    offsets = _word_offsets(cleaned)
    spans: list[Span] = []
    for a, b in ranges:
        idx = [i for i, (ws, we) in enumerate(offsets) if ws < b and we > a]
        if idx:
            spans.append((idx[0], idx[-1] + 1))
    if sentence is None:
        return _merge(spans)
    out_words = cleaned.split()
    sent_words = sentence.split()
    if out_words == sent_words:
        return _merge(spans)
    mapping: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(a=out_words, b=sent_words, autojunk=False)
    for blk in matcher.get_matching_blocks():
        for k in range(blk.size):
            mapping[blk.a + k] = blk.b + k
    mapped = []
    for s, e in spans:
        hits = [mapping[i] for i in range(s, e) if i in mapping]
        if hits:
            mapped.append((min(hits), max(hits) + 1))
    return _merge(mapped)


def _merge(spans: Sequence[Span]) -> list[Span]:
    """Sorted, with overlapping ranges merged."""
    out: list[list[int]] = []
    for s, e in sorted((int(s), int(e)) for s, e in spans):
        if out and s < out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]
