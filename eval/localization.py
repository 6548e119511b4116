"""Hallucinated-segment localization (AlignBench Table 5 / Table H, HalDec-Bench Table 5 / Table K).

A localizing judge marks the wrong part of the sentence as ``**[...]**`` (e.g. ``A **[red]** bird singing in a
tree.``), often inside a ```` ```json {"output": "..."} ``` ```` block. :func:`parse_marked` turns that into
``[start_word, end_word)`` ranges over whitespace words — the bench's ``spans`` convention, the same words as
``str.split()`` (and ``halsift.corpus.sentences.words``).

Metrics, over the sentences that have ground-truth spans:
- AP: the share (%) of predicted spans whose IoU with some ground-truth span is >= 0.3 (appendix E, "a prediction
  is considered correct if its IoU with a GT span is greater than or equal to 0.3 ... precision as the proportion
  of predicted spans that are judged correct").
- mIoU: per sentence, the IoU between the predicted and the ground-truth word sets (the union of each side's
  spans; no prediction = 0), averaged over all sentences (Table K, "compute the intersection over union between
  the predicted and ground-truth segments and compute the average for all samples").
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence

import numpy as np

IOU_THRESHOLD = 0.3
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


def span_iou(a: Sequence[int], b: Sequence[int]) -> float:
    """IoU of two word ranges ``[start, end)``."""
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
    union = (a[1] - a[0]) + (b[1] - b[0]) - inter
    return inter / union if union > 0 else 0.0


def set_iou(pred: Sequence[Sequence[int]], gt: Sequence[Sequence[int]]) -> float:
    """IoU of the word sets covered by two lists of ranges (0 if either side is empty)."""
    p = {i for s, e in pred for i in range(s, e)}
    g = {i for s, e in gt for i in range(s, e)}
    if not p or not g:
        return 0.0
    return len(p & g) / len(p | g)


def localization_metrics(preds: Sequence[Sequence[Sequence[int]]], gts: Sequence[Sequence[Sequence[int]]],
                         threshold: float = IOU_THRESHOLD) -> dict[str, float]:
    """AP and mIoU (both %) over sentences; ``preds[i]`` / ``gts[i]`` are the spans of sentence i.

    Sentences without a ground-truth span are skipped. Returns ``ap`` (NaN when nothing was predicted), ``miou``,
    ``n_sentences``, ``n_pred``, ``n_hit``.
    """
    if len(preds) != len(gts):
        raise ValueError(f"localization: {len(preds)} predictions but {len(gts)} ground truths")
    n_pred = n_hit = n = 0
    ious = []
    for p, g in zip(preds, gts):
        if not len(g):
            continue
        n += 1
        for span in p:
            n_pred += 1
            n_hit += max(span_iou(span, gs) for gs in g) >= threshold - 1e-12  # 0.3 inclusive despite float error
        ious.append(set_iou(p, g))
    return {"ap": 100.0 * n_hit / n_pred if n_pred else float("nan"),
            "miou": 100.0 * float(np.mean(ious)) if ious else float("nan"),
            "n_sentences": n, "n_pred": n_pred, "n_hit": n_hit}
